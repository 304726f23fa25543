export TOK=/work/main/.gpulead/.gpu_assets/tokenizer
for c in 6a7cfb1 994cf94; do
  echo "== $c $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  (cd /tmp/gve/$c && PYTHONPATH=$PWD timeout 900 /work/main/.venv/bin/python /tmp/gve/cpu_modes.py --waves 2 --rounds 4 --json /tmp/gve/b_$c.json 2>&1 | grep -v Warn | tail -4)
done
echo done $(date +%T)

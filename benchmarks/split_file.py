"""Split a file into parts of at most --max-mb MB with a sha256 manifest, and join them back.

A file too big for one copy to the GPU machine (64 MiB per call) travels in parts:

    python benchmarks/split_file.py MODEL.gguf .gpu_model --max-mb 50 --subdirs   # .gpu_model/part1/, part2/, ...
    python benchmarks/split_file.py --join /tmp/rfmodel .gpu_model/part2 --out /tmp/model.gguf

With --subdirs each part goes to its own folder (OUT/part1, OUT/part2, ...), each with a copy of
manifest.json, so one folder can be carried per call. Joining looks for the parts in all the
folders given and checks every part's and the whole file's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

MANIFEST = "manifest.json"
CHUNK = 1 << 20


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def split_file(path: str, out_dir: str, max_mb: float = 50.0, subdirs: bool = False) -> dict:
    """Write the parts (equal sizes, each <= max_mb * 1e6 bytes) and manifest.json; return the manifest."""
    size = os.path.getsize(path)
    limit = int(max_mb * 1e6)
    n = max(1, -(-size // limit))
    per = -(-size // n)
    name = os.path.basename(path)
    manifest = {"name": name, "size": size, "sha256": sha256_file(path), "parts": []}
    with open(path, "rb") as f:
        for i in range(1, n + 1):
            data = f.read(per)
            part_dir = os.path.join(out_dir, f"part{i}") if subdirs else out_dir
            os.makedirs(part_dir, exist_ok=True)
            part = f"{name}.part{i}"
            with open(os.path.join(part_dir, part), "wb") as g:
                g.write(data)
            manifest["parts"].append({"file": part, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    dirs = [os.path.join(out_dir, f"part{i}") for i in range(1, n + 1)] if subdirs else [out_dir]
    for d in dirs:
        with open(os.path.join(d, MANIFEST), "w") as g:
            json.dump(manifest, g, indent=1)
    return manifest


def _find(name: str, dirs: list[str]) -> str:
    for d in dirs:
        if os.path.isfile(os.path.join(d, name)):
            return os.path.join(d, name)
    raise FileNotFoundError(f"{name} is in none of {dirs}")


def join_parts(dirs: list[str], out_path: str) -> str:
    """Reassemble the file described by manifest.json from parts found in `dirs`; verify sha256."""
    with open(_find(MANIFEST, dirs)) as f:
        manifest = json.load(f)
    if os.path.isfile(out_path) and os.path.getsize(out_path) == manifest["size"] and sha256_file(out_path) == manifest["sha256"]:
        return out_path  # already joined
    tmp = f"{out_path}.tmp{os.getpid()}"
    whole = hashlib.sha256()
    with open(tmp, "wb") as g:
        for p in manifest["parts"]:
            with open(_find(p["file"], dirs), "rb") as f:
                data = f.read()
            if hashlib.sha256(data).hexdigest() != p["sha256"]:
                os.remove(tmp)
                raise ValueError(f"part {p['file']} is damaged (sha256 mismatch)")
            whole.update(data)
            g.write(data)
    if whole.hexdigest() != manifest["sha256"]:
        os.remove(tmp)
        raise ValueError(f"joined {manifest['name']} does not match the manifest sha256")
    os.replace(tmp, out_path)
    return out_path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+", help="FILE OUT_DIR to split; with --join, the folders holding the parts")
    ap.add_argument("--max-mb", type=float, default=50.0)
    ap.add_argument("--subdirs", action="store_true", help="one folder per part: OUT_DIR/part1, part2, ...")
    ap.add_argument("--join", action="store_true")
    ap.add_argument("--out", help="with --join: the file to write")
    a = ap.parse_args()
    if a.join:
        if not a.out:
            sys.exit("--join needs --out")
        print(join_parts(a.paths, a.out), "ok (sha256 verified)")
        return
    if len(a.paths) != 2:
        sys.exit("give FILE OUT_DIR")
    m = split_file(a.paths[0], a.paths[1], a.max_mb, a.subdirs)
    print(f"{m['name']}: {m['size']} bytes -> {len(m['parts'])} parts of <= {max(p['size'] for p in m['parts'])} bytes, "
          f"sha256 {m['sha256'][:16]}...")


if __name__ == "__main__":
    main()

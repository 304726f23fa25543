import time, torch, torch.nn.functional as F
torch.manual_seed(0)
for M in (16, 512, 2048, 8192):
    for (N, K) in ((6144, 4096), (28672, 4096), (4096, 14336)):
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        for _ in range(3): F.linear(x, w)
        torch.cuda.synchronize()
        # host time per launch with the GPU far behind (a long kernel first, so no launch waits)
        torch.cuda._sleep(200_000_000)
        t = time.perf_counter()
        for _ in range(50): F.linear(x, w)
        host = (time.perf_counter() - t) / 50 * 1e6
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        for _ in range(20): F.linear(x, w)
        e.record(); torch.cuda.synchronize()
        print(f"M={M:5d} N={N:5d} K={K:5d}: host {host:6.1f} us/launch, GPU {s.elapsed_time(e)/20*1000:8.1f} us", flush=True)
x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)
for name, fn in (("add", lambda: x + 1), ("empty", lambda: torch.empty(2048, 4096, device="cuda"))):
    torch.cuda._sleep(100_000_000); t = time.perf_counter()
    for _ in range(200): fn()
    print(f"{name}: host {(time.perf_counter() - t) / 200 * 1e6:.1f} us/call"); torch.cuda.synchronize()

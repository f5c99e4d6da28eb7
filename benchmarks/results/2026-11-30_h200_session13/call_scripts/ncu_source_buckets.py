import csv, gzip, sys
rows = list(csv.reader(gzip.open(sys.argv[1], 'rt'))); hdr = rows[1]; data = [r for r in rows[2:] if len(r) >= len(hdr)]; ix = {h: i for i, h in enumerate(hdr)}
S = lambda r: int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
tot = sum(S(r) for r in data); B = int(sys.argv[2])
for b in range(0, len(data), B):
    chunk = data[b:b+B]; s = sum(S(r) for r in chunk)
    if s < tot * 0.005: continue
    top = max(chunk, key=S)
    print(f"{b:6d}-{b+B:6d} {s:7d} {100*s/tot:5.1f}%  top: {top[1].strip()[:50]} ({S(top)})")

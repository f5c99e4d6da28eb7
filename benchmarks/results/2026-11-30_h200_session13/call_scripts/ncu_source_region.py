import csv, gzip, sys, collections
f, lo, hi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = list(csv.reader(gzip.open(f, 'rt')))
hdr = rows[1]; data = rows[2:]; ix = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot = collections.Counter(); n = 0; nall = sum(int(r[ix['Warp Stall Sampling (All Samples)']] or 0) for r in data if len(r) >= len(hdr))
for k in range(lo, hi):
    r = data[k]; s = int(r[ix['Warp Stall Sampling (All Samples)']] or 0); n += s
    br = {c: int(r[ix[c]] or 0) for c in stall_cols}
    for c, v in br.items(): tot[c] += v
    if s >= int(sys.argv[4]) or 'GMMA' in r[1] or 'DEPBAR' in r[1] or 'SYNCS' in r[1]:
        top = ", ".join(f"{c[6:]}={v}" for c, v in sorted(br.items(), key=lambda x: -x[1])[:3] if v)
        print(f"{k:6d} {s:6d} ex={r[ix['Instructions Executed']]:>8s} {r[1].strip()[:70]:70s} {top}")
print("region samples", n, f"{100*n/nall:.1f}% of all")
for c, v in tot.most_common(8): print(f"  {c:28s} {v:8d} {100*v/n:5.1f}%")

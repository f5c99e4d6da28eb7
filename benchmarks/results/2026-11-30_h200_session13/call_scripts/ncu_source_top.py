import csv, gzip, sys, collections
f = sys.argv[1]
rows = list(csv.reader(gzip.open(f, 'rt')))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
tot = collections.Counter(); n_all = 0
recs = []
for k, r in enumerate(data):
    if len(r) < len(hdr): continue
    s = int(r[ix['Warp Stall Sampling (All Samples)']] or 0)
    n_all += s
    br = {c: int(r[ix[c]] or 0) for c in stall_cols}
    for c, v in br.items(): tot[c] += v
    recs.append((s, k, r[ix['Source']].strip(), br, r[ix['Instructions Executed']]))
print("total samples", n_all)
for c, v in tot.most_common(12): print(f"  {c:28s} {v:8d} {100*v/n_all:5.1f}%")
recs.sort(reverse=True)
print("top instructions:")
for s, k, src, br, ex in recs[:int(sys.argv[2]) if len(sys.argv) > 2 else 40]:
    top = ", ".join(f"{c[6:]}={v}" for c, v in sorted(br.items(), key=lambda x: -x[1])[:3] if v)
    print(f"{k:6d} {s:7d} {100*s/n_all:5.1f}%  ex={ex:>9s}  {src[:60]:60s} {top}")

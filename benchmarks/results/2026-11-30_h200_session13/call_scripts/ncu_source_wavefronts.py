import csv, gzip, sys, collections
rows = list(csv.reader(gzip.open(sys.argv[1], 'rt'))); hdr = rows[1]; data = rows[2:]; ix = {h: i for i, h in enumerate(hdr)}
c = collections.Counter(); e = collections.Counter()
for r in data:
    if len(r) < len(hdr): continue
    w = int(r[ix['L1 Wavefronts Shared']] or 0)
    if not w: continue
    op = r[1].split()[0] if not r[1].strip().startswith('@') else r[1].split()[1]
    op = op.split('.')[0] + ('.' + r[1].split('.')[1].split()[0] if 'GMMA' in op else '')
    c[op] += w; e[op] += int(r[ix['Instructions Executed']] or 0)
tot = sum(c.values()); print("total wavefronts (SASS-attributed)", tot, "per SM", tot // 132)
for k, v in c.most_common(15): print(f"  {k:30s} {v:12d} {100*v/tot:5.1f}%  ex={e[k]}")

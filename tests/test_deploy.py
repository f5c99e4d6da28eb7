"""deploy/: the Grafana dashboard queries only metrics that exist (ours from glm5_fastpath.metrics, SGLang's
from deploy/sglang_metrics.txt, a list taken from the sglang 0.5.23 source with line citations), and the
compose / provisioning files reference files that exist."""
import json
import re
from pathlib import Path

from glm5_fastpath import metrics as gm
from glm5_fastpath.dashboard import aggregate as agg

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
DASH = json.loads((DEPLOY / "grafana/dashboards/glm5_fastpath.json").read_text())
NAME = re.compile(r"(sglang:[a-zA-Z0-9_:]+|glm5_fastpath_[a-zA-Z0-9_]+)")


def sglang_metrics() -> dict[str, str]:
    out = {}
    for line in (DEPLOY / "sglang_metrics.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, typ = line.split()
            out[name] = typ
    return out


def exposed_series() -> set[str]:
    """Every series name a Prometheus scrape can show for the known metrics."""
    known = dict(sglang_metrics())
    known.update({n: t for n, (t, _) in gm.METRICS.items()})
    out = set()
    for n, t in known.items():
        out |= {n + s for s in ("_bucket", "_sum", "_count")} if t == "histogram" else {n}
    return out


def targets():
    for p in DASH["panels"]:
        for t in p.get("targets", []):
            yield p, t


def test_every_query_uses_existing_metrics():
    series = exposed_series()
    used = set()
    for p, t in targets():
        names = NAME.findall(t["expr"])
        assert names, (p["title"], t["expr"])
        for n in names:
            assert n in series, f"panel {p['title']!r}: unknown metric {n}"
            used.add(n)
    # the dashboard covers what issue 7 asks for
    for must in ("sglang:time_to_first_token_seconds_bucket", "sglang:inter_token_latency_seconds_bucket",
                 "sglang:e2e_request_latency_seconds_bucket", "sglang:generation_tokens_total",
                 "glm5_fastpath_path_total", "glm5_fastpath_decode_step_seconds_bucket"):
        assert must in used, must


def test_grouping_labels_exist_on_our_metrics():
    for p, t in targets():
        for by, body in re.findall(r"by \(([^)]*)\)\s*\((.*)", t["expr"]):
            ours = [n for n in NAME.findall(body) if n.startswith("glm5_fastpath_")]
            for n in ours:
                base = re.sub(r"_(bucket|sum|count)$", "", n) if n not in gm.METRICS else n
                labels = set(gm.METRICS[base][1]) | {"le"}
                for lab in (x.strip() for x in by.split(",")):
                    assert lab in labels, (p["title"], lab, base)


def test_datasource_and_files():
    uids = {t["datasource"]["uid"] for _, t in targets()} | {p["datasource"]["uid"] for p in DASH["panels"] if "datasource" in p}
    assert uids == {"glm5-prometheus"}
    assert "uid: glm5-prometheus" in (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    compose = (DEPLOY / "docker-compose.yml").read_text()
    for rel in re.findall(r"- \./([^:]+):", compose):
        assert (DEPLOY / rel).exists(), rel
    assert "/var/lib/grafana/dashboards/glm5_fastpath.json" in compose
    assert "127.0.0.1:30000" in (DEPLOY / "prometheus.yml").read_text()
    ids = [p["id"] for p in DASH["panels"]]
    assert len(ids) == len(set(ids))


def test_builtin_page_reads_the_same_names():
    known = sglang_metrics()
    for name in agg.LATENCY.values():
        assert known[name] == "histogram", name
    assert known[agg.GEN_TOKENS] == "counter"
    assert {agg.STEP, agg.PATH, agg.SELECTED} <= set(gm.METRICS)

"""`glm5-fastpath dashboard`: the aggregator on real prometheus_client output, the HTTP endpoints
against a fake metrics server on localhost, and (where Debian's chromium is installed) the page
rendering live numbers in headless Chromium."""
import json
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from glm5_fastpath.cli import build_parser
from glm5_fastpath.dashboard import aggregate as agg
from glm5_fastpath.dashboard.server import make_server
from glm5_fastpath.metrics import FastpathMetrics

LAT_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class FakeSGLang:
    """A registry with SGLang's metric names/labels (as its TokenizerMetricsCollector declares them) plus ours."""

    def __init__(self):
        self.reg = CollectorRegistry()
        lab = ["model_name", "is_streaming"]
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "ttft", lab, buckets=LAT_BUCKETS, registry=self.reg)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "itl", ["model_name"], buckets=LAT_BUCKETS, registry=self.reg)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "e2e", ["model_name"], buckets=LAT_BUCKETS, registry=self.reg)
        self.gen = Counter("sglang:generation_tokens", "gen", lab, registry=self.reg)
        self.ours = FastpathMetrics(self.reg)

    def feed(self, ttft=(), itl=(), tokens=0):
        for i, v in enumerate(ttft):
            self.ttft.labels("glm5", str(i % 2 == 0)).observe(v)  # two label sets, merged by the aggregator
        for v in itl:
            self.itl.labels("glm5").observe(v)
        self.e2e.labels("glm5").observe(1.5)
        if tokens:
            self.gen.labels("glm5", "False").inc(tokens)

    def text(self):
        return generate_latest(self.reg).decode()


def test_quantile_rule():
    h = agg.Hist({0.1: 0, 0.2: 50, 0.5: 100, float("inf"): 100})
    assert agg.quantile(0.5, h) == pytest.approx(0.2)
    assert agg.quantile(0.25, h) == pytest.approx(0.15)  # linear inside (0.1, 0.2]
    assert agg.quantile(0.99, h) == pytest.approx(0.2 + 0.3 * 49 / 50)
    assert agg.quantile(0.5, agg.Hist({0.1: 0, float("inf"): 0})) is None
    assert agg.quantile(0.99, agg.Hist({0.1: 1, float("inf"): 10})) == 0.1  # +Inf bucket -> highest finite bound


def test_aggregate_real_output():
    f = FakeSGLang()
    f.feed(ttft=[0.015] * 50 + [0.3] * 50, itl=[0.012] * 99 + [1.5], tokens=1000)
    f.ours.observe_step("16", "stock", 0.004)
    f.ours.observe_step("16", "stock", 0.006)
    f.ours.observe_step("1", "stock", 0.002)
    f.ours.count_path("stock", "table_selects_stock", 9)
    f.ours.count_path("fast", "selected", 1)
    f.ours.set_selected([(1, "stock", "stock"), (16, "stock", "stock")])
    s0 = agg.parse(f.text(), ts=100.0)
    out = agg.summarize(s0, None)
    t = out["latency"]["ttft"]
    assert t["count"] == 100 and not t["window"]
    assert 0.01 <= t["p50"] <= 0.02 and 0.2 <= t["p90"] <= 0.5
    assert out["latency"]["itl"]["p50"] < 0.02 and out["latency"]["e2e"]["p50"] > 1.0
    assert out["tokens_per_s"] is None and out["generation_tokens"] == 1000
    assert out["fast_path_share"] == pytest.approx(0.1)
    assert list(out["step"]) == ["1", "16"] and out["step"]["16"]["count"] == 2
    assert out["step"]["16"]["mean"] == pytest.approx(0.005)
    assert out["path_reasons"] == {"fast/selected": 1.0, "stock/table_selects_stock": 9.0}
    assert out["selected"] == [{"bucket": "1", "prefix": "stock", "moe": "stock"},
                               {"bucket": "16", "prefix": "stock", "moe": "stock"}]
    # second scrape: the window only sees the new observations
    f.feed(ttft=[1.5] * 10, tokens=500)
    f.ours.count_path("stock", "prefill_extend", 4)
    s1 = agg.parse(f.text(), ts=102.0)
    out = agg.summarize(s1, s0)
    t = out["latency"]["ttft"]
    assert t["window"] and t["count"] == 110 and 1.0 <= t["p50"] <= 2.0
    assert not out["latency"]["itl"]["window"]  # nothing new: cumulative
    assert out["tokens_per_s"] == pytest.approx(250.0)
    assert out["fast_path_share"] == 0.0
    json.dumps(out)  # the endpoint's payload must be JSON-serialisable


class _Fake(BaseHTTPRequestHandler):
    source = None

    def do_GET(self):  # noqa: N802
        body = self.source().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _serve(srv):
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return srv


@pytest.fixture
def servers():
    f = FakeSGLang()
    f.feed(ttft=[0.015] * 10, itl=[0.012] * 10, tokens=10)
    f.ours.observe_step("8", "stock", 0.003)
    f.ours.count_path("stock", "table_selects_stock")

    def source():  # every scrape sees a little more traffic
        f.feed(ttft=[0.03], itl=[0.011] * 5, tokens=50)
        return f.text()

    handler = type("H", (_Fake,), {"source": staticmethod(source)})
    fake = _serve(ThreadingHTTPServer(("127.0.0.1", 0), handler))
    dash = _serve(make_server(f"http://127.0.0.1:{fake.server_address[1]}/metrics", "127.0.0.1", 0))
    yield f"http://127.0.0.1:{dash.server_address[1]}"
    for s in (dash, fake):
        s.shutdown()
        s.server_close()


def _get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers.get("Content-Type"), r.read().decode()


def test_http_endpoints(servers):
    code, ctype, page = _get(servers + "/")
    assert code == 200 and ctype.startswith("text/html")
    assert "<canvas" in page and "api/metrics" in page
    assert not re.search(r"(src|href)=\"https?://", page) and "cdn" not in page.lower()  # works offline
    code, ctype, body = _get(servers + "/api/metrics")
    d = json.loads(body)
    assert d["ok"] and d["latency"]["ttft"]["p50"] > 0 and d["step"]["8"]["count"] == 1
    d2 = json.loads(_get(servers + "/api/metrics")[2])
    assert d2["tokens_per_s"] > 0 and d2["latency"]["itl"]["window"]
    assert _get(servers + "/healthz")[2] == "ok\n"
    with pytest.raises(urllib.error.HTTPError):
        _get(servers + "/nope")


def test_unreachable_metrics_url_is_reported():
    dash = _serve(make_server("http://127.0.0.1:9/metrics", "127.0.0.1", 0))
    try:
        d = json.loads(_get(f"http://127.0.0.1:{dash.server_address[1]}/api/metrics")[2])
        assert not d["ok"] and "cannot scrape http://127.0.0.1:9/metrics" in d["error"]
    finally:
        dash.shutdown()
        dash.server_close()


def test_cli_parses_dashboard():
    a = build_parser().parse_args(["dashboard", "--metrics-url", "http://h:30000/metrics", "--port", "9"])
    assert (a.metrics_url, a.port, a.host, a.cmd) == ("http://h:30000/metrics", 9, "127.0.0.1", "dashboard")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_page_renders_live_numbers_in_headless_chromium(servers):
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                        "--virtual-time-budget=4000", "--dump-dom", servers + "/?interval=300"],
                       capture_output=True, text=True, timeout=90)
    dom = r.stdout
    assert r.returncode == 0 and dom, r.stderr[-2000:]
    updates = int(re.search(r'data-updates="(\d+)"', dom).group(1))
    assert updates >= 2, dom[:2000]
    for key in ("ttft", "itl", "e2e"):
        v = re.search(rf'id="{key}-p50">([^<]*)<', dom).group(1)
        assert float(v) > 0, (key, v)
    assert float(re.search(r'id="tps">([^<]*)<', dom).group(1)) > 0
    assert re.search(r"<td>8</td><td>[0-9.]+</td>", dom), "per-bucket step row missing"
    assert "stock/table_selects_stock" in dom

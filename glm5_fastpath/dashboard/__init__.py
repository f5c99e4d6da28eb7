"""`glm5-fastpath dashboard`: a small local web page with live latency charts read from an SGLang
`/metrics` endpoint (for people without Grafana). Standard library HTTP server, one offline HTML page
(plain JS + canvas, no CDN), one JSON endpoint (aggregate.py). Imports nothing heavy.
"""

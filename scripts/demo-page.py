#!/usr/bin/env python3
"""The demo shop's web server (scripts/demo.sh): the page folder on loopback, every answer with
the Server-Timing a CDN in front of a shop adds (a cache hit, the edge's and the origin's time),
which the tracking script reports and the collector reads its cdn_cache from.

Usage: demo-page.py PORT FOLDER
"""
import functools
import http.server
import sys


class Handler(http.server.SimpleHTTPRequestHandler):
    def end_headers(self):
        self.send_header("Server-Timing", "cdn-cache;desc=HIT, edge;dur=12, origin;dur=80")
        super().end_headers()


port, folder = int(sys.argv[1]), sys.argv[2]
handler = functools.partial(Handler, directory=folder)
http.server.ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()

/* Collector tracking script: one measurement per page view. Definitions: README, "The tracking script". */
(function () {
  try {
    // Loaders (Rocket Loader, fetch-and-eval) leave currentScript null: find our tag.
    var doc = document, perf = performance,
      script = doc.currentScript || doc.querySelector('script[data-site][src*="/script.js"]');
    var site = script && script.getAttribute('data-site');
    if (!site || !perf || !window.PerformanceObserver) return;
    var base = script.src.replace(/\/script\.js(\?.*)?$/, ''), endpoint = base + '/api/v1/measurements';
    // The site's sample_rate: unknown until this answer, 0 for an unknown site, 1 if unreachable.
    var rate, settings = fetch(base + '/api/v1/sites/' + site, { credentials: 'omit' })
      .then(function (r) { return r.status == 404 ? { sample_rate: 0 } : r.json(); })
      .then(function (s) { rate = s.sample_rate; }, function () {})
      .then(function () { if (typeof rate != 'number') rate = 1; });

    var uuid = function () {
      if (crypto.randomUUID) return crypto.randomUUID();
      var b = crypto.getRandomValues(new Uint8Array(16)), h = [];
      b[6] = b[6] & 15 | 64; b[8] = b[8] & 63 | 128;
      for (var i = 0; i < 16; i++) h.push((b[i] + 256).toString(16).slice(1));
      h = h.join('');
      return [h.slice(0, 8), h.slice(8, 12), h.slice(12, 16), h.slice(16, 20), h.slice(20)].join('-');
    };
    var observe = function (type, fn, opts) {
      try {
        var o = new PerformanceObserver(function (l) { l.getEntries().forEach(fn); });
        opts = opts || {}; opts.type = type; opts.buffered = true;
        o.observe(opts);
        return o;
      } catch (e) {
        // An entry type this browser does not support: nothing to observe.
      }
    };

    var nav = perf.getEntriesByType('navigation')[0] || {};
    var activation = nav.activationStart || 0;
    var since = function (t) { return Math.max(0, t - activation); };
    var m, draw, attempts, delivered, lcpDone, clsSession, clsStart, clsLast, interactions;

    var start = function (restored) {
      m = { id: uuid(), site: site, url: location.href, referrer: doc.referrer || undefined,
        navigation_type: restored ? 'restore' : activation > 0 || doc.prerendering ? 'prerender' : nav.type,
        effective_connection_type: navigator.connection && navigator.connection.effectiveType,
        viewport_width: innerWidth,
        // The page view's start, set once and sent unchanged by every send of it: the
        // collector files the row by it, so that every resend folds (README: storage).
        ts: Math.round(restored || !perf.timeOrigin ? Date.now() : perf.timeOrigin + activation) };
      // One sampling decision per page view: it sends when draw < rate.
      draw = Math.random();
      attempts = 0; delivered = false; lcpDone = false;
      clsSession = 0; clsStart = 0; clsLast = 0; interactions = {};
    };
    start(false);
    if (nav.responseStart > 0) m.ttfb_ms = since(nav.responseStart);

    observe('paint', function (e) { if (e.name === 'first-contentful-paint') m.fcp_ms = since(e.startTime); });
    var lcp = observe('largest-contentful-paint', function (e) { if (!lcpDone) m.lcp_ms = since(e.startTime); });
    var stopLcp = function (e) { if (e.isTrusted !== false) lcpDone = true; if (lcp) lcp.disconnect(); };
    ['keydown', 'pointerdown'].forEach(function (t) { addEventListener(t, stopLcp, { once: true, capture: true }); });

    observe('layout-shift', function (e) {
      if (e.hadRecentInput) return;
      if (clsSession && e.startTime - clsLast < 1000 && e.startTime - clsStart < 5000) clsSession += e.value;
      else { clsSession = e.value; clsStart = e.startTime; }
      clsLast = e.startTime;
      m.cls = Math.max(m.cls || 0, clsSession);
    });

    var onEvent = function (e) {
      if (!e.interactionId) return;
      interactions[e.interactionId] = Math.max(interactions[e.interactionId] || 0, e.duration);
      var d = Object.keys(interactions).map(function (k) { return interactions[k]; }).sort(function (a, b) { return b - a; });
      m.inp_ms = d[Math.min(d.length - 1, Math.floor(d.length / 50))];
    };
    observe('event', onEvent, { durationThreshold: 16 });
    observe('first-input', onEvent);

    // First send at the first hide by fetch (its answer can be read); a 429 or 503 is retried
    // after Retry-After, another failure after 0.5-1.5 s; any other answer (202, or a 4xx that
    // a resend cannot change) ends it; at pagehide, unless ended, once more by sendBeacon. At
    // most two sends, one id, one sampling decision.
    var later = function (r) {
      var s = r && parseInt(r.headers.get('Retry-After'), 10);
      return s >= 0 ? Math.min(s, 60) * 1000 : 500 + Math.random() * 1000;
    };
    var send = function (beacon) {
      if (rate === undefined) return settings.then(function () { send(beacon); });
      if (delivered || attempts > 1 || !(draw < rate)) return;
      attempts++;
      if (!m.dom_content_loaded_ms && nav.domContentLoadedEventEnd) m.dom_content_loaded_ms = since(nav.domContentLoadedEventEnd);
      if (!m.load_ms && nav.loadEventEnd) m.load_ms = since(nav.loadEventEnd);
      var body = JSON.stringify(m), retry = attempts < 2;
      if (beacon && navigator.sendBeacon && navigator.sendBeacon(endpoint, body)) return;
      try {
        fetch(endpoint, { method: 'POST', body: body, keepalive: true, headers: { 'Content-Type': 'text/plain' } })
          .then(function (r) { if (r.status == 429 || r.status >= 500) { if (retry) setTimeout(send, later(r)); } else delivered = true; })
          .catch(function () { if (retry) setTimeout(send, later()); });
      } catch (e) {
        // Nothing more to do.
      }
    };
    addEventListener('visibilitychange', function () { if (doc.visibilityState === 'hidden') send(false); }, true);
    addEventListener('pagehide', function () { send(true); }, true);
    // A back/forward cache restore is a new page view.
    addEventListener('pageshow', function (e) {
      if (!e.persisted) return;
      start(true);
      var t = e.timeStamp;
      requestAnimationFrame(function () { requestAnimationFrame(function () { m.fcp_ms = m.lcp_ms = perf.now() - t; }); });
    }, true);
  } catch (e) {
    // Never break the page.
  }
})();

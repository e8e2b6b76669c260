/* Collector tracking script: one measurement per page view. Definitions: docs/script.md. */
(function () {
  try {
    // Loaders (Rocket Loader, fetch-and-eval) leave currentScript null: find our tag.
    var doc = document, perf = performance,
      script = doc.currentScript || doc.querySelector('script[data-site][src*="/script.js"]');
    var site = script && script.getAttribute('data-site');
    if (!site || !window.PerformanceObserver) return;
    var base = script.src.replace(/\/script\.js(\?.*)?$/, ''), endpoint = base + '/api/v1/measurements';
    // The site's sample_rate: unknown until this answer, 0 for an unknown site, 1 if unreachable.
    var rate, settings = fetch(base + '/api/v1/sites/' + site, { credentials: 'omit' })
      .then(function (r) { return r.status == 404 ? { sample_rate: 0 } : r.json(); })
      .then(function (s) { rate = s && s.sample_rate; })
      .catch(function () {})
      .then(function () { if (typeof rate != 'number') rate = 1; });
    // Handlers and observer callbacks run outside this try: each gets its own.
    var safe = function (fn) { return function (a) { try { fn(a); } catch (e) {} }; };
    var on = function (type, fn) { addEventListener(type, safe(fn), true); };

    // Everything below runs when the page is shown: at once, or for a prerendered page
    // (speculation rules) at its activation, as web-vitals waits for it: observers registered
    // then get the buffered entries when activationStart is known, the page view starts then,
    // and a prerender never shown sends nothing.
    var run = function () {
      // A UUIDv7 (RFC 9562): the page view's start in its first 48 bits, so that a beacon of it
      // files by that time even without ts (contract v4 §3); the rest random.
      var uuid = function (ms) {
        var b = crypto.getRandomValues(new Uint8Array(16)), h = '';
        for (var j = 5; j >= 0; j--) { b[j] = ms % 256; ms = Math.floor(ms / 256); }
        b[6] = b[6] & 15 | 112; b[8] = b[8] & 63 | 128;
        for (var i = 0; i < 16; i++) h += (i > 3 && i < 11 && !(i % 2) ? '-' : '') + (b[i] + 256).toString(16).slice(1);
        return h;
      };
      // A resource's address without its query and fragment: the collector stores no more
      // (signed URLs carry their signature there), so it is not sent either.
      var bare = function (u) { return u.split(/[?#]/)[0]; };
      // What this engine measures: a metric it measures is sent even when it measured nothing
      // (CLS 0); one it does not is left out, so NULL means "not measured".
      var types = PerformanceObserver.supportedEntryTypes || [];
      var can = function (t) { return types.indexOf(t) >= 0; };
      // Entries not yet delivered are taken at hide (a click just before leaving).
      var pending = [];
      var observe = function (type, fn, opts) {
        if (!can(type)) return;
        try {
          var o = new PerformanceObserver(safe(function (l) { l.getEntries().forEach(fn); update(); }));
          o.observe(Object.assign({ type: type, buffered: true }, opts));
          pending.push(function () { o.takeRecords().forEach(fn); });
          return o;
        } catch (e) {
          // Listed but refused: nothing to observe.
        }
      };

      var nav = perf.getEntriesByType('navigation')[0] || {}, act = nav.activationStart || 0;
      var since = function (t) { return Math.max(0, t - act); };
      // Text cut to the collector's bounds (64 bytes of UTF-8, whole characters): past them it
      // drops the whole field (contract v4).
      var cut = function (t) {
        t = Array.from(String(t)).slice(0, 64);
        while (new TextEncoder().encode(t.join('')).length > 64) t.pop();
        return t.join('');
      };
      // The page's dimensions (collectorq, below): every page view starts with those set so far.
      var dims = Object.create(null);
      var copy = function () { return Object.keys(dims).length ? Object.assign(Object.create(null), dims) : undefined; };

      // The page view being measured. Observers write into the current one; every send, answer
      // and timer holds its own view, so a late answer of one page view never touches another
      // (a back/forward-cache restore starts a new one). state: 0 not sent, 1 a fetch in
      // flight, 2 waiting to retry, 3 done.
      var view;
      var start = function (type, ts) {
        view = { m: { id: uuid(Math.round(ts)), site: site, url: location.href, referrer: doc.referrer || undefined,
          navigation_type: type, effective_connection_type: (navigator.connection || {}).effectiveType,
          viewport_width: innerWidth,
          // The page view's start, sent unchanged by every send of it: the collector files the
          // row by it, so that every resend folds (docs/storage.md).
          ts: Math.round(ts), cls: can('layout-shift') ? 0 : undefined,
          dimensions: copy() },
          // One sampling decision per page view: it sends when draw < rate.
          draw: Math.random(), state: 0, sends: 0, cls: 0, inp: {}, ic: perf.interactionCount };
      };
      // The body is made whenever a value changes, so that leaving the page only sends.
      var update = function (v) { v = v || view; v.body = JSON.stringify(v.m); };
      start(act > 0 ? 'prerender' : doc.wasDiscarded ? 'restore' : nav.type,
        perf.timeOrigin ? perf.timeOrigin + act : Date.now());
      // As web-vitals: no TTFB from an entry whose responseStart is not after the page's start
      // and before now (WebKitGTK gives negative ones for pages from its cache).
      var ttfb = function () {
        if (nav.responseStart > 0 && nav.responseStart < perf.now()) first.m.ttfb_ms = since(nav.responseStart);
      };
      var first = view;
      ttfb();
      // The response's Server-Timing (a CDN's cache status, the origin's time), where the
      // engine exposes it (Chromium, WebKit; Firefox on secure pages: https, loopback).
      var st = (nav.serverTiming || []).slice(0, 10).map(function (t) {
        return { name: cut(t.name), dur: Math.min(Math.max(t.duration, 0), 36e5) || 0, desc: cut(t.description) };
      });
      if (st.length) first.m.server_timing = st;
      var loaded = function () {
        setTimeout(function () {
          ttfb();
          if (nav.domContentLoadedEventEnd) first.m.dom_content_loaded_ms = since(nav.domContentLoadedEventEnd);
          if (nav.loadEventEnd) first.m.load_ms = since(nav.loadEventEnd);
          update(first);
        });
      };
      if (doc.readyState == 'complete') loaded(); else on('load', loaded);
      update();

      // A CSS selector of a node, as the web-vitals library builds it (its getSelector): from
      // tag names, ids and sorted class names only, never text or values; at most 100 characters.
      var selector = function (n) {
        var sel = '', part;
        try {
          while (n && n.nodeType != 9) {
            part = n.id ? '#' + n.id : [n.nodeType == 1 ? n.nodeName.toLowerCase() : n.nodeName.toUpperCase().replace(/^#/, '')]
              .concat(Array.from(n.classList || []).sort()).join('.');
            if (sel.length + part.length > 99) return sel || part;
            sel = sel ? part + '>' + sel : part;
            if (n.id) break;
            n = n.parentNode;
          }
        } catch (e) {
          // A detached or foreign node: what was built so far.
        }
        return sel || undefined;
      };

      // Paint entries belong to the load, never to a restored view (measured from the restore).
      observe('paint', function (e) { if (e.name == 'first-contentful-paint') first.m.fcp_ms = since(e.startTime); });
      // LCP of view v from e, a largest-contentful-paint entry, counted from time a (the
      // activation, or a route change's interaction) with TTFB ttfb; and its attribution, as
      // web-vitals' attribution build: the element, its resource, and the time after TTFB split
      // into the resource's load delay, its load, and the render.
      var lcpOf = function (v, e, a, ttfb) {
        var m = v.m, res;
        if (v.lcpDone || !e) return;
        m.lcp_ms = Math.max(0, e.startTime - a);
        m.lcp_target = e.element ? selector(e.element) : e.id ? '#' + e.id : undefined;
        // Only a fetched resource: a data: image's URL is the image itself (Firefox gives it whole).
        m.lcp_url = /^https?:/.test(e.url) ? bare(e.url) : undefined;
        perf.getEntriesByType('resource').forEach(function (r) {
          if (e.url && r.name == e.url && (r.requestStart || r.startTime) <= e.startTime) res = r;
        });
        var start = Math.max(ttfb, res ? (res.requestStart || res.startTime) - a : 0),
          end = Math.min(m.lcp_ms, Math.max(start, res ? res.responseEnd - a : 0));
        m.lcp_resource_load_delay_ms = start - ttfb;
        m.lcp_resource_load_duration_ms = end - start;
        m.lcp_element_render_delay_ms = m.lcp_ms - end;
        update(v);
      };
      var onLcp = function (e) { lcpOf(first, e, act, since(nav.responseStart) || 0); };
      var lcp = observe('largest-contentful-paint', onLcp);
      // A route change's LCP (Chromium's soft navigations): the largest paint of the interaction
      // that made it, counted from that interaction's start, TTFB 0, as web-vitals with
      // reportSoftNavs (its interaction-contentful-paint entries of other interactions do not count).
      var onIcp = function (e) { if (e && e.interactionId == view.iid) lcpOf(view, e.largestContentfulPaint, e.startTime, 0); };
      observe('interaction-contentful-paint', onIcp);
      // LCP ends at the visitor's first input (a route change's, at the first input after it); the
      // page's own synthetic events do not count.
      var stopLcp = function (e) {
        if (!e.isTrusted) return;
        if (lcp && !first.lcpDone) { lcp.takeRecords().forEach(onLcp); lcp.disconnect(); }
        first.lcpDone = view.lcpDone = 1;
      };
      on('keydown', stopLcp); on('click', stopLcp);

      // CLS: the largest session window (shifts less than 1 s apart, at most 5 s); its largest
      // shift is the attribution, with its first element source.
      observe('layout-shift', function (e) {
        var v = view, m = v.m, src = e.sources || [];
        if (e.hadRecentInput) return;
        if (!(v.cls && e.startTime - v.clsLast < 1000 && e.startTime - v.clsStart < 5000)) { v.cls = 0; v.clsStart = e.startTime; v.big = 0; }
        v.cls += e.value;
        v.clsLast = e.startTime;
        if (!v.big || e.value >= v.big.value) {
          src = src.filter(function (s) { return s.node && s.node.nodeType == 1; })[0] || src[0];
          v.big = { value: e.value, time: e.startTime, target: src && src.node ? selector(src.node) : undefined };
        }
        if (v.cls > m.cls) {
          m.cls = v.cls;
          m.cls_target = v.big.target; m.cls_time_ms = v.big.time; m.cls_value = v.big.value;
        }
      });

      // INP: per interaction its longest entry; the 98th percentile of them (one ignored per
      // 50). Its phases, as web-vitals measures them: entries presented in one frame (render
      // times within 8 ms) are a group, whose earliest processing start and latest end bound
      // the processing; and the script that ran longest in the long animation frames it spans.
      var frames = [], loafs = [];
      // The attribution of view v's INP interaction; again when a long animation frame arrives
      // (the engine reports it after the frame, so after the interaction's entries).
      var inpParts = function (v) {
        var m = v.m, it = v.inpAt, f, g, ps, paint, pe, best = 0;
        if (!it) return;
        f = it.e; g = it.g;
        ps = Math.max(g.ps, f.startTime); paint = Math.max(f.startTime + f.duration, ps); pe = Math.min(g.pe, paint);
        m.inp_ms = f.duration;
        m.inp_target = it.t;
        m.inp_type = f.name.indexOf('key') ? 'pointer' : 'keyboard';
        m.inp_input_delay_ms = ps - f.startTime;
        m.inp_processing_duration_ms = pe - ps;
        m.inp_presentation_delay_ms = paint - pe;
        m.inp_script_url = undefined;
        loafs.forEach(function (l) {
          if (l.startTime + l.duration < f.startTime || l.startTime > pe) return;
          (l.scripts || []).forEach(function (sc) {
            var d = sc.startTime + sc.duration - Math.max(f.startTime, sc.startTime);
            if (d > best && /^https?:/.test(sc.sourceURL)) { best = d; m.inp_script_url = bare(sc.sourceURL); }
          });
        });
      };
      observe('long-animation-frame', function (e) { loafs.push(e); loafs = loafs.slice(-50); inpParts(view); });
      var onEvent = function (e) {
        var v = view, i = v.inp, end = e.startTime + e.duration, g, k, it, all;
        for (k = frames.length; k-- && !g;) if (Math.abs(end - frames[k].end) <= 8) g = frames[k];
        if (g) { g.ps = Math.min(g.ps, e.processingStart); g.pe = Math.max(g.pe, e.processingEnd); }
        else { frames.push(g = { end: end, ps: e.processingStart, pe: e.processingEnd }); if (frames.length > 10) frames.shift(); }
        if (!e.interactionId) return;
        it = i[e.interactionId];
        if (!it || e.duration > it.e.duration) i[e.interactionId] = { e: e, g: g, t: (it && it.t) || (e.target && selector(e.target)) };
        else if (!it.t && e.target) it.t = selector(e.target);
        all = Object.values(i).sort(function (a, b) { return b.e.duration - a.e.duration; });
        v.inpAt = all[Math.min(all.length - 1, Math.floor(all.length / 50))];
        inpParts(v);
      };
      observe('event', onEvent, { durationThreshold: 40 });
      observe('first-input', onEvent);

      // Sends page view v: once when nothing fails, at most twice, always with its one id.
      // While the page lives (a tab switch) by fetch, whose answer it reads: a 429 or 503 is
      // retried after Retry-After, another failure after 0.5-1.5 s. While it is left
      // (beforeunload, else pagehide) by sendBeacon, which outlives the page, and only if no
      // keepalive fetch of this view is in flight. A keepalive fetch is refused at once when
      // the page's keepalive requests (another script's too) hold their 64 KiB: it is made
      // again without keepalive, which the page carries while it lives (and which Chromium
      // still sent when made at pagehide); leaving with that one in flight sends by sendBeacon.
      // Once per view: its later sends go without keepalive, so that an unreachable collector
      // gets at most 3 requests of a page view (a refused connection rejects as the budget does).
      var later = function (r) {
        var s = r && r.headers && parseInt(r.headers.get('Retry-After'), 10);
        return s >= 0 ? Math.min(s, 60) * 1000 : 500 + Math.random() * 1000;
      };
      // Leaving while a fetch without keepalive is in flight (the page would cancel it) sends by
      // sendBeacon, a third send if need be: the one case of a 4th request of a page view.
      var send = function (v, alive) {
        var rescue = !alive && v.state == 1 && v.weak;
        if (v.state == 3 || !rescue && (v.state == 1 || v.sends > 1)) return;
        if (rate === undefined && alive) return settings.then(function () { send(v, alive); });
        // Leaving before the settings answered: an unknown rate counts as 1. The rate drawn at
        // goes with the page view, so that its row weighs 1 / rate (contract v4).
        var r = rate === undefined ? 1 : rate;
        if (!(v.draw < r)) return;
        if (v.m.sample_rate != r) { v.m.sample_rate = r; update(v); }
        v.sends++;
        var retry = function (r) { if (v.state < 3) { v.state = 2; setTimeout(function () { send(v, true); }, later(r)); } };
        var post = function (keep) {
          v.weak = !keep;
          // A string body goes as text/plain;charset=UTF-8 (Fetch standard), as sendBeacon's: a
          // simple request, no preflight.
          fetch(endpoint, { method: 'POST', body: v.body, keepalive: keep })
            .then(function (r) { if (r.status == 429 || r.status >= 500) retry(r); else v.state = 3; },
              function (e) { if (keep) { v.fell = 1; post(false); } else retry(e); })
            .catch(function () {});
        };
        try {
          if (!alive && navigator.sendBeacon && navigator.sendBeacon(endpoint, v.body)) { v.state = 3; return; }
          v.state = alive ? 1 : 3;
          post(!v.fell);
        } catch (e) {
          // Nothing more to do.
        }
      };
      // Leaving sends at beforeunload, the first event of it in every engine that fires one: a
      // browser quitting (Firefox: beforeunload, then visibilitychange and pagehide as it shuts
      // down) can drop a beacon queued at the later events unsent, though sendBeacon accepted
      // it (issue 38). Engines without beforeunload send at pagehide, or at a visibilitychange
      // to hidden that comes first.
      var flush = function () {
        pending.forEach(function (take) { take(); });
        // A page view whose interactions all took under 40 ms (no entry observed): 8 ms, as
        // web-vitals for a route change or a restore (Event Timing's granularity). The load's
        // first interaction always has its first-input entry.
        if (!view.m.inp_ms && perf.interactionCount > view.ic) view.m.inp_ms = 8;
        update();
      };
      var hide = function (alive) {
        flush();
        send(view, alive);
      };
      on('beforeunload', function () { hide(false); });
      on('visibilitychange', function () { if (doc.visibilityState == 'hidden') hide(true); });
      on('pagehide', function () { hide(false); });
      // A back/forward-cache restore is a new page view: FCP (and LCP where the engine measures
      // it) from the restore to the next frame, TTFB 0, as the web-vitals library reports it.
      on('pageshow', function (e) {
        if (!e.persisted) return;
        start('back_forward_cache', Date.now());
        var v = view, t = e.timeStamp;
        v.m.ttfb_ms = 0;
        update();
        requestAnimationFrame(function () {
          requestAnimationFrame(function () {
            v.m.fcp_ms = perf.now() - t;
            if (lcp) v.m.lcp_ms = v.m.fcp_ms;
            update(v);
          });
        });
      });
      // A route change of a single-page app, where the engine reports it ('soft-navigation'
      // entries: Chromium): the page view so far ends (the load's LCP with it) and is sent (the
      // page lives on, so by a readable fetch), with the interaction that made the route change
      // (its entries come before this one; those still queued are taken first). A new page view
      // starts at that interaction with its own id and URL, TTFB 0, FCP to the route change's
      // first paint and LCP (above), as web-vitals reports a soft navigation; CLS and INP from
      // then on are the new view's.
      observe('soft-navigation', function (e) {
        var prev = view, icp = e.getLargestInteractionContentfulPaint, paint = e.presentationTime || e.paintTime;
        flush();
        send(prev, true);
        first.lcpDone = 1;
        start('soft_navigation', (perf.timeOrigin || Date.now() - perf.now()) + e.startTime);
        view.iid = e.interactionId;
        view.m.url = e.name;
        view.m.referrer = prev.m.url;
        view.m.ttfb_ms = 0;
        if (paint) view.m.fcp_ms = Math.max(0, paint - e.startTime);
        // Its largest paint so far, which may have been reported before this entry.
        if (icp) onIcp(icp.call(e));
      });
      // Dimensions: collectorq.push(['dimension', NAME, VALUE]) before this script ran (queued)
      // or after (push replaced), at most 5 names, each of the form the collector takes (1 to
      // 32 of a-z, 0-9, _): a malformed name takes no place (an undeclared one still does). The page view's body is made again, so a
      // value set before its last send goes with it. Last, so that a page's odd collectorq
      // costs nothing else.
      var q = window.collectorq = window.collectorq || [];
      var command = function (c) {
        if (c && c[0] == 'dimension' && /^[a-z0-9_]{1,32}$/.test(c[1]) && c[2] != null && (c[1] in dims || Object.keys(dims).length < 5)) {
          dims[c[1]] = cut(c[2]);
          view.m.dimensions = copy();
          update();
        }
      };
      q.forEach(safe(command));
      q.push = function () { [].forEach.call(arguments, safe(command)); return q.length; };
    };
    if (doc.prerendering) doc.addEventListener('prerenderingchange', safe(run), true); else run();
  } catch (e) {
    // Never break the page.
  }
})();

/* Placeholder tracking script: sends one measurement with navigation timings when the page
   is hidden. The real script (Core Web Vitals) replaces it. */
(function () {
  try {
    var s = document.currentScript, site = s && s.getAttribute('data-site');
    if (!site || !navigator.sendBeacon) return;
    var base = s.src.replace(/\/script\.js(\?.*)?$/, '');
    var id = crypto.randomUUID ? crypto.randomUUID() : 'xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx'.replace(/[xy]/g, function (c) {
      var r = Math.random() * 16 | 0; return (c === 'x' ? r : (r & 3 | 8)).toString(16);
    });
    var sent = false;
    var send = function () {
      if (sent || document.visibilityState !== 'hidden') return;
      sent = true;
      var n = performance.getEntriesByType('navigation')[0] || {};
      var m = { id: id, site: site, url: location.href, ts: Date.now(), referrer: document.referrer || undefined,
        ttfb_ms: n.responseStart, dom_content_loaded_ms: n.domContentLoadedEventEnd || undefined, load_ms: n.loadEventEnd || undefined,
        viewport_width: innerWidth };
      navigator.sendBeacon(base + '/api/v1/measurements', JSON.stringify(m));
    };
    addEventListener('visibilitychange', send);
    addEventListener('pagehide', function () { send(); });
  } catch (e) { /* never break the page */ }
})();

// The UI works without this script. It only writes the browser's own
// navigation timing into the page once it has loaded, so the benchmark
// that opens every page can read how long each one took.
"use strict";
window.addEventListener("load", function () {
  setTimeout(function () {
    var nav = performance.getEntriesByType("navigation")[0];
    if (nav) {
      document.documentElement.setAttribute("data-load-ms", String(Math.round(nav.loadEventEnd - nav.startTime)));
      document.documentElement.setAttribute("data-response-ms", String(Math.round(nav.responseEnd - nav.startTime)));
    }
  }, 0);
});

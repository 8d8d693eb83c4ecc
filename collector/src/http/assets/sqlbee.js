// The UI works without this script. It writes the browser's own
// navigation timing into the page once it has loaded, so the benchmark
// that opens every page can read how long each one took; and it keeps a
// live part of a page (`data-refresh-ms`, the Activity page) fresh by
// fetching the page again and swapping that part in place.
"use strict";
window.addEventListener("load", function () {
  setTimeout(function () {
    var nav = performance.getEntriesByType("navigation")[0];
    if (nav) {
      document.documentElement.setAttribute("data-load-ms", String(Math.round(nav.loadEventEnd - nav.startTime)));
      document.documentElement.setAttribute("data-response-ms", String(Math.round(nav.responseEnd - nav.startTime)));
    }
  }, 0);
  var live = document.querySelector("[data-refresh-ms]");
  if (!live || !window.fetch || !window.DOMParser) {
    return;
  }
  var every = Number(live.getAttribute("data-refresh-ms")) || 2000;
  var tick = function () {
    fetch(location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (answer) {
        if (!answer.ok) {
          throw new Error(String(answer.status));
        }
        return answer.text();
      })
      .then(function (text) {
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById(live.id);
        if (fresh) {
          live.innerHTML = fresh.innerHTML;
        }
      })
      .catch(function () {})
      .then(function () {
        setTimeout(tick, every);
      });
  };
  setTimeout(tick, every);
});

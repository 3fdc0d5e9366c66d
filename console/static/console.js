// Deniable operator console: while a page says data-refresh="N" (something still collects), re-fetch
// it every N seconds and swap <main>. Pages work without this script; it only saves a reload.
"use strict";
(function () {
  const main = document.getElementById("main");
  if (!main || !main.dataset.refresh) return;
  const seconds = Math.max(2, Number(main.dataset.refresh) || 5);
  async function refresh() {
    const active = document.activeElement;
    if (active && main.contains(active) && active.matches("input, select, textarea")) return; // typing
    try {
      const response = await fetch(window.location.href, { credentials: "same-origin", cache: "no-store" });
      if (!response.ok) return;
      const doc = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = doc.getElementById("main");
      if (fresh) {
        main.replaceChildren(...fresh.childNodes);
        if (!fresh.dataset.refresh) { delete main.dataset.refresh; clearInterval(timer); }
      }
    } catch (error) {
      // the console is unreachable for a moment: keep the last page and try again
    }
  }
  const timer = setInterval(refresh, seconds * 1000);
})();

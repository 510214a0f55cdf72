// The run page's first chart, drawn by the page's own HTML while Streamlit is still mounting its live
// chart (chart.first_chart_tags; issue 11: in a fresh browser Streamlit's page has made the chart's
// place ~0.3 s before its lazily loaded component has drawn anything there).
// As the HTML is parsed it asks the server's first-chart route for the figure the live chart will
// draw first (the run page's controls as they start, in the theme of its first script run) and runs
// plotly.js (window.__metricsRunPlotly, chart.plotly_head_tags).  Once Streamlit's page has the live
// chart's element, it draws the figure there as a static picture on top of it (no hover, no zoom;
// clicks go through to the page), following it as the page settles, and removes it when the live
// chart has drawn in that element (or said there that it could not), when the page leaves this URL,
// or when the page's first script run ends without that element (an unreadable run, a run picker).  Never anywhere else: a picture
// that jumped into place as the page formed would be worse than a late one.
(() => {
  const route = __FIRST_CHART_ROUTE__; // relative to the server's base URL (chart.first_chart_tags)
  const base = window.__streamlit && window.__streamlit.BACKEND_BASE_URL;
  const run = new URLSearchParams(location.search).get("run");
  if (!base || !run || !window.__metricsRunPlotly) return;
  const page = location.href;
  const url = new URL(route, base);
  url.search = new URLSearchParams({ run, theme: theme() });
  fetch(url, { cache: "no-store" })
    .then((answer) => (answer.status === 200 ? answer.json() : null))
    .then((first) => {
      if (!first) return undefined;
      window.__metricsRunPlotly();
      return window.__metricsPlotly.then((Plotly) => follow(Plotly, first));
    })
    .catch((error) => console.warn("metrics_core: no early first chart", error));

  // The theme of the page's first script run (widgets.page_theme: the one Streamlit reports):
  // the one chosen in its settings menu (kept per page path), else the system's.
  function theme() {
    let chosen = "System";
    try {
      chosen = JSON.parse(localStorage.getItem(`stActiveTheme-${location.pathname}-v2`)) || chosen;
    } catch (error) {
      // no storage (a sandboxed frame) or not JSON: the system's theme
    }
    const dark = chosen === "Dark" || (chosen !== "Light" && matchMedia("(prefers-color-scheme: dark)").matches);
    return dark ? "dark" : "light";
  }

  function follow(Plotly, { key, figure }) {
    const slot = `.st-key-${CSS.escape(key)}`;
    const drawn = `${slot} .js-plotly-plot .main-svg, ${slot} .metrics-chart-note`; // or failed: chart.js says why
    const finished = "[data-testid=stApp][data-test-script-state=notRunning]";
    let box = null;
    let frame = null;
    let ended = false;
    const update = () => {
      if (ended) return;
      const target = document.querySelector(slot);
      if (location.href !== page || document.querySelector(drawn) || (!target && document.querySelector(finished))) {
        ended = true;
        observer.disconnect();
        removeEventListener("scroll", later, true);
        removeEventListener("resize", later);
        if (box) Plotly.purge(box);
        if (box) box.remove();
      } else if (target) {
        const { left, top, width } = target.getBoundingClientRect();
        const first = box === null;
        const resized = !first && box.style.width !== `${width}px`;
        if (first) {
          box = document.createElement("div");
          box.className = "metrics-first-chart";
          box.style.cssText = "position: absolute; z-index: 999990; pointer-events: none;";
          document.body.appendChild(box);
        }
        Object.assign(box.style, { left: `${left + scrollX}px`, top: `${top + scrollY}px`, width: `${width}px` });
        if (first) Plotly.newPlot(box, figure.data, figure.layout, { staticPlot: true });
        else if (resized) Plotly.Plots.resize(box);
      }
    };
    // Streamlit changes the page many times a frame while it renders: follow it once per frame, but
    // draw in the task that made the live chart's element, so that both appear in the same frame.
    const later = () => {
      if (frame !== null) return;
      frame = requestAnimationFrame(() => {
        frame = null;
        update();
      });
    };
    const observer = new MutationObserver(() => (box === null && document.querySelector(slot) ? update() : later()));
    observer.observe(document.documentElement, { subtree: true, childList: true, attributes: true,
      attributeFilter: ["data-test-script-state"] });
    addEventListener("scroll", later, true); // Streamlit's main block scrolls, not the document
    addEventListener("resize", later);
    update();
  }
})();

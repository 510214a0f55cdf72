// The run page's status line and live refresh (live_push.py).  Shows the run's status line, and asks
// the server whether the run has a snapshot newer than the one this tab shows (a long poll of
// data.url, which names that snapshot, the page's signature and chart options, plus what each
// chart holds).  The answer brings the new status line and each chart's payload from the figure it
// holds (live_chart.js applies them): no rerun.  When anything else on the page changed
// (answer.rerun), or a chart cannot take the route's payloads (zoomed to raw points, or still being
// drawn), it reruns the live fragment (a trigger) saying which figure each chart holds; so it does
// after applying an answer whose findings' messages changed (answer.details), at most once per
// data.details_ms.  That rerun
// mounts this element again with the new snapshot's URL, which starts a new poll.  An answer to a
// question about charts that were drawn since it was asked (the first one, asked while they were
// being drawn) is not used: the question is asked again for what they hold now.  A trigger is
// repeated only if none came within STALL_MS (a busy server queues many tabs' reruns: asking again
// sooner would only queue more of them).  A server that cannot be reached is asked again after a
// refresh period.  Every text is set as text, never markup.
const STALL_MS = 30000;

function show(parentElement, status, counts) {
  let line = parentElement.querySelector(".metrics-status");
  if (status === undefined) {
    if (line) line.remove();
    return;
  }
  if (!line) {
    line = document.createElement("div");
    line.className = "metrics-status";
    line.style.cssText = "font-size: 0.875rem; opacity: 0.6; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;";
    line.append(document.createElement("b"), document.createTextNode(""));
    parentElement.appendChild(line);
  }
  line.firstChild.textContent = status;
  line.lastChild.textContent = counts;
}

export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  const watch = parentElement.__metricsWatch || (parentElement.__metricsWatch = {});
  watch.trigger = setTriggerValue;
  if (watch.url === data.url) return;
  show(parentElement, data.status, data.counts);
  if (watch.stop) watch.stop.abort();
  const stop = new AbortController();
  Object.assign(watch, { url: data.url, stop });
  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const drawnAt = Date.now();
  (async () => {
    const url = new URL(data.url, location.href);
    let seen = Number(url.searchParams.get("seen"));
    const feeds = url.searchParams.has("sig"); // a run the page shows: its charts can be fed
    while (!stop.signal.aborted) {
      try {
        const charts = feeds && window.__metricsLive ? window.__metricsLive.held() : { held: {}, complete: false };
        url.searchParams.set("seen", String(seen));
        if (charts.complete) url.searchParams.set("held", JSON.stringify(charts.held));
        else url.searchParams.delete("held");
        const answer = await fetch(url, { signal: stop.signal, cache: "no-store" });
        const body = answer.ok ? await answer.json() : {};
        const now = feeds && window.__metricsLive ? window.__metricsLive.held() : charts;
        if (JSON.stringify(now) !== JSON.stringify(charts)) continue; // drawn meanwhile: ask for what it holds now
        if (body.serial > seen && charts.complete && body.charts) {
          window.__metricsLive.apply(body.charts);
          show(parentElement, body.status, body.counts);
          seen = body.serial;
          if (body.details !== data.details && Date.now() - drawnAt > data.details_ms) {
            watch.trigger("changed", { serial: body.serial, held: window.__metricsLive.held().held });
            await pause(STALL_MS);
          }
        } else if (body.serial > seen) {
          watch.trigger("changed", { serial: body.serial, held: charts.held });
          await pause(STALL_MS);
        } else if (!answer.ok) {
          await pause(data.retry_ms);
        }
      } catch (error) {
        if (stop.signal.aborted) return;
        await pause(data.retry_ms);
      }
    }
  })();
  return () => {
    stop.abort();
    delete watch.url;
  };
}

// The run page's live refresh (live_push.py): asks the server whether the run has a snapshot newer
// than the one this tab drew (a long poll of data.url, which names that snapshot), and when it has,
// reruns the live fragment (a trigger).  That rerun mounts this element again with the new
// snapshot's URL, which starts a new poll; a trigger is repeated only if none came within STALL_MS
// (a busy server queues many tabs' reruns: asking again sooner would only queue more of them).
// Draws nothing.  A server that cannot be reached is asked again after a refresh period.
const STALL_MS = 30000;

export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  const watch = parentElement.__metricsWatch || (parentElement.__metricsWatch = {});
  watch.trigger = setTriggerValue;
  if (watch.url === data.url) return;
  if (watch.stop) watch.stop.abort();
  const stop = new AbortController();
  Object.assign(watch, { url: data.url, stop });
  const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  (async () => {
    const seen = Number(new URL(data.url, location.href).searchParams.get("seen"));
    while (!stop.signal.aborted) {
      try {
        const answer = await fetch(data.url, { signal: stop.signal, cache: "no-store" });
        const { serial } = answer.ok ? await answer.json() : {};
        if (serial > seen) {
          watch.trigger("changed", serial);
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

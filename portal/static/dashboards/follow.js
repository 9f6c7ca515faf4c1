// A job's page follows the job while it is not final: every `data-every` seconds it reads the
// job from the API (`data-url`, with the page's own session) and reloads the page when the
// state, the reason, the number of attempts or the estimated start (to the minute) differ from
// what the page shows (`data-state`, `data-reason`, `data-attempts`, `data-estimate`). It waits
// while the tab is hidden, and while someone is typing in a field, so nothing typed is lost.
(function () {
  "use strict";
  var shown = document.getElementById("follow");
  if (!shown) return;
  var every = parseFloat(shown.dataset.every) * 1000;
  if (!(every > 0)) return;

  // The page shows the estimated start to the minute: a refresh that moves it by seconds
  // changes nothing shown.
  function sameMinute(a, b) {
    if (!a || !b) return !a && !b;
    return Math.floor(Date.parse(a) / 60000) === Math.floor(Date.parse(b) / 60000);
  }

  function changed(job) {
    return (
      job.state !== shown.dataset.state ||
      (job.reason || "") !== shown.dataset.reason ||
      String(job.attempt_count) !== shown.dataset.attempts ||
      !sameMinute(job.estimated_start, shown.dataset.estimate)
    );
  }

  function busy() {
    var active = document.activeElement;
    return document.hidden || (active && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName));
  }

  function look() {
    if (busy()) {
      setTimeout(look, every);
      return;
    }
    fetch(shown.dataset.url, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then(function (response) {
        if (response.status === 404 || response.status === 403) return null; // out of sight
        return response.ok ? response.json() : {};
      })
      .then(function (job) {
        if (job === null) return;
        if (job.state && changed(job)) {
          window.location.reload();
          return;
        }
        setTimeout(look, every);
      })
      .catch(function () {
        setTimeout(look, every); // the portal restarting, the network: look again later
      });
  }

  setTimeout(look, every);
})();

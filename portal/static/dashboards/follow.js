// A page that follows what it shows, every `data-every` seconds, reloading itself when that
// changed. It waits while the tab is hidden, and while someone is typing in a field, so that
// nothing typed is lost. Two kinds of pages:
// - a job's page (`data-url`: the job in the API, read with the page's own session): it reloads
//   when the state, the reason, the number of attempts or the estimated start (to the minute,
//   as shown) differ from `data-state`, `data-reason`, `data-attempts`, `data-estimate`;
// - a jobs page (`data-shown`): it asks itself (`look=1`) what it would show now, as one
//   string, and reloads when that differs.
(function () {
  "use strict";
  var shown = document.getElementById("follow");
  if (!shown) return;
  var every = parseFloat(shown.dataset.every) * 1000;
  if (!(every > 0)) return;
  var looking = shown.dataset.url ? jobLook() : pageLook();

  // The page shows the estimated start to the minute: a refresh that moves it by seconds
  // changes nothing shown.
  function sameMinute(a, b) {
    if (!a || !b) return !a && !b;
    return Math.floor(Date.parse(a) / 60000) === Math.floor(Date.parse(b) / 60000);
  }

  function jobLook() {
    return {
      url: shown.dataset.url,
      changed: function (job) {
        return (
          job.state !== undefined &&
          (job.state !== shown.dataset.state ||
            (job.reason || "") !== shown.dataset.reason ||
            String(job.attempt_count) !== shown.dataset.attempts ||
            !sameMinute(job.estimated_start, shown.dataset.estimate))
        );
      },
    };
  }

  function pageLook() {
    var url = new URL(window.location.href);
    url.searchParams.set("look", "1");
    return {
      url: url.toString(),
      changed: function (answer) {
        return answer.shown !== undefined && answer.shown !== shown.dataset.shown;
      },
    };
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
    fetch(looking.url, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    })
      .then(function (response) {
        if (response.status === 404 || response.status === 403) return null; // out of sight
        return response.ok ? response.json() : {};
      })
      .then(function (answer) {
        if (answer === null) return;
        if (looking.changed(answer)) {
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

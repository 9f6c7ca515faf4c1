// How far each time a page shows is from now: after every <time datetime=... data-from-now>
// (the `moment` template filter) it adds "(in 20 min)" or "(3 min ago)", by this browser's
// clock, and keeps it current while the page stays open. The time itself stays as the page
// wrote it (UTC); without JavaScript, only it is shown.
(function () {
  "use strict";
  var EVERY = 30000; // ms between two updates

  // A length of time as people say it: 40 s, 20 min, 3 h 5 min, 4 days (as `gpu-portal` does).
  function span(seconds) {
    seconds = Math.round(Math.abs(seconds));
    if (seconds < 90) return seconds + " s";
    var minutes = Math.round(seconds / 60);
    if (minutes < 90) return minutes + " min";
    if (minutes < 48 * 60) {
      var hours = Math.floor(minutes / 60);
      minutes -= hours * 60;
      return minutes ? hours + " h " + minutes + " min" : hours + " h";
    }
    return Math.round(minutes / 1440) + " days";
  }

  function fromNow(at, now) {
    var seconds = (at - now) / 1000;
    if (Math.abs(seconds) < 1) return "now";
    return seconds > 0 ? "in " + span(seconds) : span(seconds) + " ago";
  }

  function update() {
    var now = Date.now();
    var times = document.querySelectorAll("time[data-from-now]");
    for (var i = 0; i < times.length; i++) {
      var time = times[i];
      var at = Date.parse(time.getAttribute("datetime"));
      if (isNaN(at)) continue;
      var said = time.nextElementSibling;
      if (!said || !said.classList.contains("from-now")) {
        said = document.createElement("span");
        said.className = "from-now muted";
        time.parentNode.insertBefore(said, time.nextSibling);
      }
      said.textContent = " (" + fromNow(at, now) + ")";
    }
  }

  if (document.querySelector("time[data-from-now]")) {
    update();
    setInterval(update, EVERY);
  }
})();

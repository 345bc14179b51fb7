// The live rollout view: the server pushes the rollout's progress (server-sent events) when it changes,
// and this script rewrites the stage rows and the state; no reload. EventSource reconnects by itself.
// Times follow the console's one style (ota_server/console/display.py: `ago` and `when`): relative words
// ("37 s ago") in a <time> whose datetime and title hold the ISO 8601 UTC time; this script keeps the words current.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource) { return; }
  var note = document.getElementById("live-note");

  // As display.ago: the largest whole unit of d, h, min, s.
  function ago(seconds) {
    var whole = Math.floor(Math.abs(seconds)), words = whole + " s";
    var units = [["d", 86400], ["h", 3600], ["min", 60]];
    for (var i = 0; i < units.length; i++) {
      if (whole >= units[i][1]) { words = Math.floor(whole / units[i][1]) + " " + units[i][0]; break; }
    }
    return seconds < 0 && whole ? "in " + words : words + " ago";
  }

  // As display.when: a <time> with the ISO time (to the second, UTC) in datetime and title.
  function when(date) {
    var time = document.createElement("time");
    var iso = date.toISOString().replace(/\.\d+Z$/, "Z");
    time.dateTime = iso;
    time.title = iso;
    time.textContent = ago((Date.now() - date.getTime()) / 1000);
    return time;
  }

  function refreshTimes() {
    Array.prototype.forEach.call(document.querySelectorAll("time[datetime]"), function (time) {
      time.textContent = ago((Date.now() - Date.parse(time.getAttribute("datetime"))) / 1000);
    });
  }

  // As display.status_pill: the status in words, its meaning on hover (labels come with the progress).
  function pill(key, count, labels) {
    var label = labels[key] || [key, ""];
    var span = document.createElement("span");
    span.className = "pill " + key;
    span.textContent = label[0] + " " + count;
    if (label[1]) { span.title = label[1]; }
    return span;
  }

  function render(progress) {
    var state = document.getElementById("state");
    state.textContent = progress.state;
    state.className = "pill " + progress.state;
    document.getElementById("phase").hidden = progress.phase !== "waiting_for_promote";
    document.getElementById("reason").textContent = progress.reason ? "(" + progress.reason + ")" : "";
    var body = document.getElementById("stages");
    body.textContent = "";
    progress.stages.forEach(function (stage) {
      var row = document.createElement("tr");
      row.dataset.stage = stage.index;
      var name = document.createElement("td");
      name.textContent = stage.name;
      if (stage.note) {
        var why = document.createElement("span");
        why.className = "muted";
        why.textContent = "(" + stage.note + ")";
        name.appendChild(document.createTextNode(" "));
        name.appendChild(why);
      }
      var size = document.createElement("td");
      size.textContent = stage.size;
      var done = document.createElement("td");
      var bar = document.createElement("progress");
      bar.max = stage.size || 1;
      bar.value = stage.done;
      bar.setAttribute("aria-label", "stage " + stage.name + " committed");
      var count = document.createElement("span");
      count.className = "done";
      count.textContent = stage.done;
      done.appendChild(bar);
      done.appendChild(document.createTextNode(" "));
      done.appendChild(count);
      var statuses = document.createElement("td");
      statuses.className = "by-status";
      Object.keys(stage.by_status).forEach(function (key) {
        statuses.appendChild(pill(key, stage.by_status[key], progress.labels));
        statuses.appendChild(document.createTextNode(" "));
      });
      [name, size, done, statuses].forEach(function (cell) { row.appendChild(cell); });
      body.appendChild(row);
    });
    document.getElementById("deferred").textContent = progress.deferred;
    var late = document.getElementById("late");
    late.textContent = "";
    Object.keys(progress.late).forEach(function (key) {
      late.appendChild(pill(key, progress.late[key], progress.labels));
      late.appendChild(document.createTextNode(" "));
    });
    if (!late.firstChild) { late.textContent = "none"; }
    var flagged = document.getElementById("flagged");
    flagged.hidden = !progress.flagged;
    document.getElementById("flagged-reason").textContent = progress.flagged || "";
    note.textContent = "Live: updated ";
    note.appendChild(when(new Date()));
    note.appendChild(document.createTextNode("."));
  }

  var source = new EventSource(live.dataset.source);
  source.addEventListener("progress", function (event) { render(JSON.parse(event.data)); });
  source.onerror = function () { note.textContent = "Live: reconnecting…"; };
  window.setInterval(refreshTimes, 5000);
})();

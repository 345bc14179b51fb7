// The live rollout view: the server pushes the rollout's progress (server-sent events) when it changes,
// and this script rewrites the stage rows and the state; no reload. EventSource reconnects by itself.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource) { return; }
  var note = document.getElementById("live-note");

  function pill(text, kind) {
    var span = document.createElement("span");
    span.className = "pill " + kind;
    span.textContent = text;
    return span;
  }

  function render(progress) {
    var state = document.getElementById("state");
    state.textContent = progress.state;
    state.className = "pill " + progress.state;
    var body = document.getElementById("stages");
    body.textContent = "";
    progress.stages.forEach(function (stage) {
      var row = document.createElement("tr");
      row.dataset.stage = stage.index;
      var name = document.createElement("td");
      name.textContent = stage.name + (stage.sent ? "" : " (not sent)");
      var size = document.createElement("td");
      size.textContent = stage.size;
      var done = document.createElement("td");
      var bar = document.createElement("progress");
      bar.max = stage.size || 1;
      bar.value = stage.done;
      bar.setAttribute("aria-label", stage.name + " committed");
      var count = document.createElement("span");
      count.className = "done";
      count.textContent = " " + stage.done;
      done.appendChild(bar);
      done.appendChild(count);
      var statuses = document.createElement("td");
      statuses.className = "by-status";
      Object.keys(stage.by_status).forEach(function (key) {
        statuses.appendChild(pill(key + " " + stage.by_status[key], key));
        statuses.appendChild(document.createTextNode(" "));
      });
      [name, size, done, statuses].forEach(function (cell) { row.appendChild(cell); });
      body.appendChild(row);
    });
    document.getElementById("deferred").textContent = progress.deferred;
    var late = document.getElementById("late");
    late.textContent = "";
    Object.keys(progress.late).forEach(function (key) {
      late.appendChild(pill(key + " " + progress.late[key], key));
      late.appendChild(document.createTextNode(" "));
    });
    if (!late.firstChild) { late.textContent = "none"; }
    var flagged = document.getElementById("flagged");
    flagged.hidden = !progress.flagged;
    document.getElementById("flagged-reason").textContent = progress.flagged || "";
    note.textContent = "Live: updated " + new Date().toLocaleTimeString() + ".";
  }

  var source = new EventSource(live.dataset.source);
  source.addEventListener("progress", function (event) { render(JSON.parse(event.data)); });
  source.onerror = function () { note.textContent = "Live: reconnecting…"; };
})();

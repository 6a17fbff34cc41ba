(function () {
  "use strict";
  // The live part of a QUEUED or RUNNING run's page: ask the server for the run record, show its state,
  // current step and the suites finished so far; once the run ends, reload once for the final report
  // (which carries no script). Text is set with textContent only: nothing from the record is parsed as HTML.
  var live = document.getElementById("live");
  var note = document.getElementById("live-note");
  if (!live || !window.fetch) {
    return;
  }
  if (location.protocol !== "http:" && location.protocol !== "https:") {
    note.textContent = "A snapshot taken while the run was not finished: live updates need the page " +
      "served by orchestrator serve.";
    return;
  }
  var FINAL = ["PASSED", "FAILED", "ERROR", "LOST"];
  var api = live.getAttribute("data-api");
  var every = Number(live.getAttribute("data-every")) || 2000;

  function setText(id, text) {
    var el = document.getElementById(id);
    if (el) {
      el.textContent = text;
    }
  }

  function count(done, total) {
    return (done === null || done === undefined ? "\u2014" : done) + "/" +
      (total === null || total === undefined ? "\u2014" : total);
  }

  function suiteRow(s) {
    var tr = document.createElement("tr");
    var cls = s.state === "GREEN" ? "ok" : (s.state === "NOT_RUN" ? "muted" : "bad");
    var cells = [[s.name, ""], [s.state, cls], [count(s.tests_passed, s.tests_total), "n"],
      [count(s.checks_passed, s.checks_total), "n"],
      [typeof s.duration_s === "number" ? s.duration_s.toFixed(1) + " s" : "\u2014", "n"]];
    cells.forEach(function (c) {
      var td = document.createElement("td");
      td.textContent = c[0];
      if (c[1]) {
        td.className = c[1];
      }
      tr.appendChild(td);
    });
    return tr;
  }

  function show(rec) {
    var verdict = document.querySelector("#verdict .verdict");
    if (verdict) {
      verdict.className = "verdict " + rec.state;
    }
    setText("live-state", rec.shown_state || rec.state);
    var step = rec.live || {};
    setText("live-step", step.step ? step.step + ": " + (step.status || "") : "waiting for the box");
    setText("live-detail", step.detail || "");
    setText("live-at", step.at || "");
    var body = document.getElementById("live-suites");
    while (body.firstChild) {
      body.removeChild(body.firstChild);
    }
    (rec.suites || []).forEach(function (s) {
      body.appendChild(suiteRow(s));
    });
  }

  function poll() {
    fetch(api, {cache: "no-store", headers: {"Accept": "application/json"}})
      .then(function (resp) {
        if (!resp.ok) {
          throw new Error("the server answered " + resp.status);
        }
        return resp.json();
      })
      .then(function (rec) {
        show(rec);
        if (FINAL.indexOf(rec.state) >= 0) {
          note.textContent = "The run has ended: loading its report.";
          location.reload();
          return;
        }
        setTimeout(poll, every);
      })
      .catch(function (err) {
        note.textContent = "Live updates paused (" + err.message + "); retrying.";
        setTimeout(poll, every * 2);
      });
  }

  setTimeout(poll, every);
}());

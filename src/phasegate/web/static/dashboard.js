// phasegate's dashboard: a refused action (403, 409) says why where the person
// looks, not only in the console. A file, not inline: the pages' CSP allows
// scripts from the server alone.
document.body.addEventListener("htmx:responseError", function (e) {
  var text = e.detail.xhr.responseText;
  try { text = JSON.parse(text).detail; } catch (_) { /* not JSON: the text as it is */ }
  document.getElementById("action-error").textContent = text;
});
// Only an action's own success clears its refusal: the live re-reads of the
// page (GETs) that follow a refusal must not wipe what it said.
var PRESERVED = ["feedback-text", "reject-reason", "revert-reason"];
document.body.addEventListener("htmx:afterRequest", function (e) {
  var verb = e.detail.requestConfig && e.detail.requestConfig.verb;
  if (!e.detail.successful || !verb || verb === "get") { return; }
  document.getElementById("action-error").textContent = "";
  // What was typed survives the live re-reads (hx-preserve); once sent, it goes.
  PRESERVED.forEach(function (id) {
    var field = document.getElementById(id);
    if (field) { field.value = ""; }
  });
});
// The activity follows its newest row, unless the reader scrolled up to read.
document.body.addEventListener("htmx:beforeSwap", function () {
  var list = document.getElementById("activity");
  window.__activityAtEnd = !list || list.scrollHeight - list.scrollTop - list.clientHeight < 24;
});
document.body.addEventListener("htmx:afterSwap", function () {
  var list = document.getElementById("activity");
  if (list && window.__activityAtEnd !== false) { list.scrollTop = list.scrollHeight; }
});
document.addEventListener("DOMContentLoaded", function () {
  var list = document.getElementById("activity");
  if (list) { list.scrollTop = list.scrollHeight; }
});
// A line number of the diff picks the line a comment is on.
document.body.addEventListener("click", function (e) {
  var button = e.target.closest(".comment-on");
  if (!button) { return; }
  var path = document.getElementById("comment-path");
  var line = document.getElementById("comment-line");
  if (!path || !line) { return; }
  path.value = button.dataset.path;
  line.value = button.dataset.line;
  document.getElementById("comment-text").focus();
});
// An agent's live output: its agent_output rows appended to
// #agent-output as they come, as text (never HTML), each once (a row the page
// was rendered with is skipped: data-last-id), its last 64 KiB kept, as the
// server renders it (web/views.py agent_output); agent_started begins a run's.
var OUTPUT_CHARS = 64 * 1024;
document.body.addEventListener("htmx:sseBeforeMessage", function (e) {
  var pre = e.target;
  if (!pre || pre.id !== "agent-output") { return; }
  e.preventDefault();  // the sse extension's own swap would insert the JSON as HTML
  var row;
  try { row = JSON.parse(e.detail.data); } catch (_) { return; }  // not a row: nothing to show
  if (!row || row.id <= Number(pre.dataset.lastId || 0)) { return; }
  pre.dataset.lastId = String(row.id);
  var d = row.data || {};
  if (row.type === "agent_started") {
    pre.textContent = "── " + d.role + " agent (" + d.runner + "), " + d.phase +
      ", round " + d.round + " ──\n";
    return;
  }
  var text = pre.textContent + (d.text || "");
  if (text.length > OUTPUT_CHARS) {
    var newline = text.indexOf("\n");
    var header = text.slice(0, newline + 1);  // the run's line stays, as on the server
    text = text.slice(-(OUTPUT_CHARS - header.length));
    text = header + text.slice(text.indexOf("\n") + 1);
  }
  var atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = text;
  if (atEnd) { pre.scrollTop = pre.scrollHeight; }  // follow, unless the person scrolled up
});
// The diff's files fold one by one without script (<details>); with it, all at once.
document.addEventListener("DOMContentLoaded", function () {
  var toggles = document.getElementById("diff-toggles");
  if (!toggles) { return; }
  toggles.hidden = false;
  function fold(open) {
    document.querySelectorAll("details.diff-file").forEach(function (d) { d.open = open; });
  }
  document.getElementById("diff-collapse-all").addEventListener("click", function () { fold(false); });
  document.getElementById("diff-expand-all").addEventListener("click", function () { fold(true); });
});
// A plain form with data-confirm (removing a person, a new token) asks first, as
// htmx's hx-confirm does for the workflow's actions; cancelled, nothing is sent.
document.body.addEventListener("submit", function (e) {
  var form = e.target.closest("form[data-confirm]");
  if (form && !window.confirm(form.dataset.confirm)) { e.preventDefault(); }
});

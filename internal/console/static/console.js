// The console's only script: the live connector list, and the back links
// of error pages. Every page works without it.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var rows = document.querySelector("[data-events]");
  if (rows && window.EventSource) {
    var es = new EventSource(rows.getAttribute("data-events"));
    es.addEventListener("rows", function (e) { rows.innerHTML = e.data; });
    es.addEventListener("signedout", function () { es.close(); window.location.reload(); });
  }
  document.querySelectorAll("[data-back]").forEach(function (a) {
    a.addEventListener("click", function (e) { e.preventDefault(); history.back(); });
  });
});

// The New release form's preview: while one types a target, how many devices it matches now
// and whether the chosen version fits what they run (console:release-preview answers in JSON).
// Plain script, no dependency, no inline code: the template loads it with defer.
(function () {
  "use strict";
  var form = document.getElementById("release-form");
  if (!form) { return; }
  var url = form.getAttribute("data-preview-url");
  var matching = document.getElementById("preview-matching");
  var fit = document.getElementById("preview-compatibility");
  var allowEmpty = form.querySelector("[name=allow_empty]");
  var submit = form.querySelector("button[type=submit]");
  var timer = null;
  var asked = 0;
  var last = null;

  function query() {
    var params = new URLSearchParams();
    ["version", "filter", "device_ids"].forEach(function (name) {
      var field = form.querySelector("[name=" + name + "]");
      if (field) { params.append(name, field.value); }
    });
    form.querySelectorAll("[name=group_ids]").forEach(function (field) {
      if ((field.type === "checkbox" && field.checked)) { params.append("group_ids", field.value); }
      if (field.tagName === "SELECT") {
        Array.prototype.forEach.call(field.selectedOptions, function (o) { params.append("group_ids", o.value); });
      }
    });
    return params.toString();
  }

  function show(data) {
    last = data;
    matching.className = "";
    fit.className = "";
    fit.textContent = "";
    if (data.error) {
      matching.className = "error";
      matching.textContent = data.error;
    } else if (data.matching === 0) {
      matching.className = "error";
      matching.textContent = "Warning: the target matches 0 devices. Tick \u201cAllow empty\u201d to create it anyway (for devices that enrol later).";
    } else {
      matching.textContent = "Matching devices: " + data.matching + ".";
    }
    if (data.compatibility) {
      fit.className = data.compatibility.fits ? "" : "error";
      fit.textContent = (data.compatibility.fits ? "Compatible: " : "Incompatible: ") + data.compatibility.message;
    }
    gate();
  }

  // refuse at 0 matching devices unless "Allow empty" is ticked (the server refuses it too)
  function gate() {
    var empty = last && !last.error && last.matching === 0;
    submit.disabled = Boolean(empty && !(allowEmpty && allowEmpty.checked));
  }

  function ask() {
    var mine = ++asked;
    fetch(url + "?" + query(), { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) { return response.json(); })
      .then(function (data) { if (mine === asked) { show(data); } })
      .catch(function () { if (mine === asked) { show({ error: "Preview unavailable." }); } });
  }

  function soon() {
    clearTimeout(timer);
    timer = setTimeout(ask, 250);
  }

  form.addEventListener("input", function (event) {
    if (event.target === allowEmpty) { gate(); } else { soon(); }
  });
  form.addEventListener("change", function (event) {
    if (event.target === allowEmpty) { gate(); } else { soon(); }
  });
  ask();
})();

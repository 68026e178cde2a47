// Buttons that change a release (or anything else) ask first: a button with data-confirm
// submits its form only after the person agrees. A static file, no inline code (CSP), and
// delegated from the document so buttons that htmx swaps in are covered too.
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var button = event.submitter;
    var message = button && button.getAttribute("data-confirm");
    if (message && !window.confirm(message)) {
      event.preventDefault();
    }
  });
})();

// pocketchat page script (inlined into the webview's index by src/ui/app.rs).
// 1. Keeps #messages pinned to the bottom while the reader is at the bottom, also while
//    a reply streams (a MutationObserver sees every token). Scrolling up unpins it;
//    sending a message pins it again.
// 2. Clears the (uncontrolled) composer when Enter or Send sends a message.
// 3. window.pcCopy(text): copies a reply to the clipboard.
// 4. A code block's Copy button (src/ui/markdown.rs) copies the text of its <code>: the
//    code alone, its last line break dropped.
(function () {
  var stick = true;
  var queued = false;
  function box() { return document.getElementById("messages"); }
  document.addEventListener("scroll", function (e) {
    var el = box();
    if (el && e.target === el) {
      stick = el.scrollHeight - el.scrollTop - el.clientHeight < 48;
    }
  }, true);
  function pin() { stick = true; }

  // The composer is an uncontrolled textarea (see src/ui/chat.rs): the app keeps a copy
  // of its text from input events, and the field is cleared here, in the page, the
  // moment a message is sent — so fast typing never races a value written back.
  function composer() { return document.getElementById("composer-input"); }
  function clearIfSendable() {
    var el = composer();
    if (el && el.dataset.canSend === "true" && el.value.trim() !== "") {
      el.value = "";
      pin();
    }
  }
  window.pcClearComposer = function () {
    var el = composer();
    if (el) { el.value = ""; }
  };
  document.addEventListener("keydown", function (e) {
    if (e.target && e.target.id === "composer-input" && e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      clearIfSendable();
    }
  }, true);
  document.addEventListener("submit", function (e) {
    if (e.target && e.target.classList && e.target.classList.contains("composer")) { clearIfSendable(); }
  }, true);
  // Once per frame at most: one layout read, and a write only when not at the bottom.
  function toBottom() {
    queued = false;
    var el = box();
    if (!el || !stick) { return; }
    var bottom = el.scrollHeight - el.clientHeight;
    if (el.scrollTop < bottom - 1) { el.scrollTop = bottom; }
  }
  function schedule() {
    if (!queued) { queued = true; requestAnimationFrame(toBottom); }
  }
  // New messages and streamed tokens change the tree; a growing composer (its `rows`)
  // or a resized window shrink the list's viewport.
  new MutationObserver(schedule).observe(document.documentElement, {
    childList: true, subtree: true, characterData: true, attributes: true, attributeFilter: ["rows"]
  });
  window.addEventListener("resize", schedule);

  window.pcCopy = function (text) {
    function fallback() {
      var t = document.createElement("textarea");
      t.value = text;
      t.setAttribute("readonly", "");
      t.style.position = "fixed";
      t.style.opacity = "0";
      document.body.appendChild(t);
      t.select();
      try { document.execCommand("copy"); } catch (e) { /* nothing else to try */ }
      document.body.removeChild(t);
    }
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(text).catch(fallback);
    } else {
      fallback();
    }
  };
  document.addEventListener("click", function (e) {
    var button = e.target && e.target.closest ? e.target.closest("button.code-copy") : null;
    var code = button && button.parentNode ? button.parentNode.querySelector("pre code") : null;
    if (!code) { return; }
    window.pcCopy(code.textContent.replace(/\n$/, ""));
    if (button.dataset.copied) { button.textContent = button.dataset.copied; }
  });
})();

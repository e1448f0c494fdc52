// The console's shell: the nav bar, the page the path names (console.py serves this shell at
// each of PAGES' paths) and its refresh every few seconds, paused while the tab is hidden.

import { h, replace, errorBox } from "./dom.js";

const PAGES = [
  { path: "/", title: "Overview", module: "./pages/overview.js" },
  { path: "/topics", title: "Topics", module: "./pages/topics.js" },
  { path: "/queues", title: "Queues", module: "./pages/queues.js" },
  { path: "/consumer-groups", title: "Consumer groups", module: "./pages/consumers.js" },
  { path: "/policies", title: "Policies", module: "./pages/policies.js" },
  { path: "/messages", title: "Messages", module: "./pages/messages.js" },
];
const REFRESH_MS = 5000;

const status = document.getElementById("status");
const pauseButton = document.getElementById("pause");
let paused = false;

function setStatus(text, kind) {
  status.textContent = text;
  status.className = `status ${kind}`;
}

async function start() {
  const page = PAGES.find((p) => p.path === location.pathname) || PAGES[0];
  replace(
    document.getElementById("nav"),
    PAGES.map((p) =>
      h("a", { href: p.path, class: p === page ? "active" : "", "aria-current": p === page ? "page" : null }, p.title),
    ),
  );
  document.title = `${page.title} · hamq console`;
  const root = document.getElementById("page");
  replace(root, h("h1", {}, page.title));
  const body = h("div", { class: "page-body" });
  root.append(body);
  const context = { params: new URLSearchParams(location.search), refreshNow: () => refresh() };
  const view = (await import(page.module)).mount(body, context);

  let timer = null;
  let running = false;
  let again = false; // asked for while one ran (after an action): what it read may be older
  async function refresh() {
    clearTimeout(timer);
    if (running) {
      again = true;
      return;
    }
    running = true;
    try {
      await view.refresh();
      setStatus(`updated ${new Date().toLocaleTimeString("en-GB")}${paused ? " · paused" : ""}`, "ok");
    } catch (err) {
      setStatus(`refresh failed: ${err.message}`, "bad");
    } finally {
      running = false;
      if (again) {
        again = false;
        refresh();
      } else if (!paused && !document.hidden) timer = setTimeout(refresh, REFRESH_MS);
    }
  }
  pauseButton.addEventListener("click", () => {
    paused = !paused;
    pauseButton.textContent = paused ? "Resume" : "Pause";
    if (paused) clearTimeout(timer);
    else refresh();
    setStatus(paused ? "paused" : "resuming…", paused ? "" : "ok");
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && !paused) refresh();
  });
  await refresh();
}

start().catch((err) => {
  document.getElementById("page").append(errorBox(err));
  setStatus("console failed to start", "bad");
});

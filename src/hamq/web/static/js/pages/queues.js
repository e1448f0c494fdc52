// Queues, as RabbitMQ's management UI names declared topics: the policy that applies, the
// master's node, its mirrors (synchronised or not), messages and lag, and the sync actions.

import { api, get, seg } from "../api.js";
import { h, replace, table, badge, fmtInt, errorBox } from "../dom.js";

export function mount(root, { refreshNow }) {
  const listing = h("div");
  const notice = h("p", { class: "notice", hidden: true, role: "status" });
  root.append(
    h(
      "section",
      { class: "card" },
      h("h2", {}, "Declared topics and their mirrors"),
      h("p", { class: "hint" }, "A policy (see Policies) whose pattern matches a topic's name decides how many nodes mirror it. ", "Mirrors shown faded are not synchronised yet."),
      notice,
      listing,
    ),
  );

  async function act(q, action) {
    try {
      await api("POST", `/api/queues/${seg(q.vhost)}/${seg(q.name)}/actions`, { action });
      show(`${action === "sync" ? "Synchronising" : "Stopped synchronising"} ${q.name}.`, "ok");
    } catch (err) {
      show(`${q.name}: ${err.message}`, "bad");
    }
    refreshNow();
  }

  function show(text, kind) {
    notice.textContent = text;
    notice.className = `notice ${kind}`;
    notice.hidden = false;
  }

  async function refresh() {
    let rows;
    try {
      rows = await get("/api/queues");
    } catch (err) {
      replace(listing, errorBox(err));
      throw err;
    }
    replace(listing, queueTable(rows, act));
  }
  return { refresh };
}

function mirrors(q) {
  const synced = new Set(q.synchronised_slave_nodes || []);
  const all = q.slave_nodes || [];
  if (all.length === 0) return h("span", { class: "muted" }, "none");
  return h(
    "span",
    { class: "chips" },
    all.map((n) => h("span", { class: synced.has(n) ? "chip" : "chip unsynced", title: synced.has(n) ? "synchronised" : "not synchronised" }, n)),
  );
}

function queueTable(rows, act) {
  return table(
    [
      { label: "Vhost", value: (q) => q.vhost },
      { label: "Name", value: (q) => h("a", { href: `/topics?${new URLSearchParams({ topic: q.name, vhost: q.vhost })}` }, q.name) },
      { label: "Policy", value: (q) => (q.policy ? badge(q.policy, "info") : null) },
      { label: "Master node", value: (q) => q.node },
      { label: "Mirrors", value: mirrors },
      { label: "Synchronised", value: (q) => `${(q.synchronised_slave_nodes || []).length} / ${(q.slave_nodes || []).length}`, num: true },
      { label: "Broker", value: (q) => q.broker_name },
      { label: "Messages", value: (q) => fmtInt(q.messages), num: true },
      { label: "Lag", value: (q) => fmtInt(q.lag), num: true },
      {
        label: "Actions",
        value: (q) =>
          h(
            "span",
            { class: "actions" },
            h("button", { type: "button", class: "small", onclick: () => act(q, "sync") }, "Sync"),
            h("button", { type: "button", class: "small secondary", onclick: () => act(q, "cancel_sync") }, "Cancel sync"),
          ),
      },
    ],
    rows.map((q) => ({ ...q, __attrs: { "data-queue": `${q.vhost}/${q.name}` } })),
    "No declared topics. Declare one with `hamq admin declare-topic NAME`; policies then place its mirrors.",
    { id: "queues-table" },
  );
}

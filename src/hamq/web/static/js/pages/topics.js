// Topics: every topic the name servers route (with the policy of a declared one), and for
// the topic picked its route and each queue's offsets.

import { get, getAll, vhostQuery } from "../api.js";
import { h, replace, section, table, fmtInt, list, errorBox, badge } from "../dom.js";

export function mount(root, { params }) {
  const picked = params.get("topic");
  const vhost = params.get("vhost") || "/";
  const showSystem = h("input", { type: "checkbox", id: "show-system" });
  const detail = h("div");
  const listing = h("div");
  if (picked) root.append(section(`Topic ${picked}`, detail));
  root.append(
    h(
      "section",
      { class: "card" },
      h("div", { class: "card-head" }, h("h2", {}, "Topics"), h("label", { class: "inline" }, showSystem, " show system topics")),
      listing,
    ),
  );
  showSystem.addEventListener("change", () => refresh());

  async function refresh() {
    const r = await getAll({ topics: "/api/topics", queues: "/api/queues" });
    if (r.topics.error) {
      replace(listing, errorBox(r.topics.error));
    } else {
      const policyOf = new Map((r.queues.data || []).map((q) => [`${q.vhost}\u0000${q.name}`, q]));
      // RocketMQ's own topics and the retry / dead-letter ones are hidden unless asked for
      const rows = r.topics.data
        .filter((t) => showSystem.checked || t.kind === "normal")
        .sort((a, b) => a.name.localeCompare(b.name));
      replace(listing, topicTable(rows, policyOf));
    }
    if (picked) {
      const q = vhostQuery(vhost);
      try {
        replace(detail, topicDetail(await get(`/api/topics/${encodeURIComponent(picked)}${q ? `?${q}` : ""}`)));
      } catch (err) {
        replace(detail, errorBox(err));
      }
    }
    if (r.topics.error) throw r.topics.error;
  }
  return { refresh };
}

function href(t) {
  return `/topics?${new URLSearchParams({ topic: t.name })}`;
}

function topicTable(rows, policyOf) {
  const declared = (t) => policyOf.get(`/\u0000${t.name}`);
  return table(
    [
      { label: "Topic", value: (t) => h("a", { href: href(t) }, t.name) },
      { label: "Kind", value: (t) => t.kind },
      { label: "Policy", value: (t) => (declared(t)?.policy ? badge(declared(t).policy, "info") : null) },
      { label: "Master node", value: (t) => declared(t)?.node },
      { label: "Mirrors", value: (t) => (declared(t) ? list(declared(t).slave_nodes) : null) },
      { label: "Messages", value: (t) => fmtInt(declared(t)?.messages), num: true },
    ],
    rows.map((t) => ({ ...t, __attrs: { "data-topic": t.name } })),
    "No topics yet. A producer creates one on first send, or declare one with `hamq admin declare-topic`.",
    { id: "topics-table" },
  );
}

function topicDetail(t) {
  return h(
    "div",
    { class: "detail" },
    h("h3", {}, "Route"),
    table(
      [
        { label: "Broker", value: (q) => q.broker_name },
        { label: "Read queues", value: (q) => q.read_queue_nums, num: true },
        { label: "Write queues", value: (q) => q.write_queue_nums, num: true },
        { label: "Perm", value: (q) => PERM[q.perm] ?? q.perm },
        { label: "Members (id: address)", value: (q) => list(Object.entries(brokerAddrs(t, q.broker_name)), ([id, a]) => `${id}: ${a}`) },
      ],
      t.queue_datas,
      "No group serves this topic.",
    ),
    h("h3", {}, "Queue offsets"),
    table(
      [
        { label: "Broker", value: (q) => q.broker_name },
        { label: "Queue", value: (q) => q.queue_id, num: true },
        { label: "Min offset", value: (q) => fmtInt(q.min_offset), num: true },
        { label: "Max offset", value: (q) => fmtInt(q.max_offset), num: true },
        { label: "Messages", value: (q) => fmtInt(q.max_offset - q.min_offset), num: true },
        {
          label: "",
          value: (q) =>
            q.max_offset > q.min_offset &&
            h("a", { href: `/messages?${new URLSearchParams({ topic: t.name, vhost: t.vhost, broker_name: q.broker_name, queue_id: q.queue_id, offset: q.max_offset - 1 })}` }, "last message"),
        },
      ],
      t.queues,
      "No queue offsets: no master serves this topic right now.",
    ),
  );
}

// RocketMQ's PermName bits.
const PERM = { 2: "write", 4: "read", 6: "read-write" };

function brokerAddrs(t, brokerName) {
  return t.broker_datas.find((b) => b.broker_name === brokerName)?.broker_addrs ?? {};
}

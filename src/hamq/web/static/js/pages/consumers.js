// Consumer groups: each group's members and, per queue, the broker's and the group's offsets
// and the lag between them.

import { get, getAll } from "../api.js";
import { h, replace, section, table, fmtInt, list, errorBox } from "../dom.js";

// Groups shown with their queues at once; more than this are listed and opened one by one.
const EXPANDED_MAX = 12;

export function mount(root, { params }) {
  const picked = params.get("group");
  const summary = h("div");
  const details = h("div", { class: "stack" });
  root.append(section("Consumer groups", summary), details);

  async function refresh() {
    let groups;
    try {
      groups = await get("/api/consumer-groups");
    } catch (err) {
      replace(summary, errorBox(err));
      throw err;
    }
    groups.sort((a, b) => a.name.localeCompare(b.name));
    const shown = picked ? [picked] : groups.slice(0, EXPANDED_MAX).map((g) => g.name);
    const r = await getAll(Object.fromEntries(shown.map((g) => [g, `/api/consumer-groups/${encodeURIComponent(g)}`])));
    replace(summary, groupTable(groups.map((g) => ({ name: g.name, detail: r[g.name]?.data }))));
    replace(details, shown.map((g) => section(`Group ${g}`, r[g].error ? errorBox(r[g].error) : groupDetail(r[g].data))));
  }
  return { refresh };
}

function groupTable(groups) {
  return table(
    [
      { label: "Group", value: (g) => h("a", { href: `/consumer-groups?group=${encodeURIComponent(g.name)}` }, g.name) },
      { label: "Topics", value: (g) => g.detail && list([...new Set(g.detail.queues.map((q) => q.topic))].sort()) },
      { label: "Online members", value: (g) => g.detail && fmtInt(g.detail.members.length), num: true },
      { label: "Total lag", value: (g) => g.detail && lagText(g.detail.total_lag), num: true },
    ],
    groups,
    "No consumer groups yet: a group appears once it commits an offset or a consumer of it is online.",
    { id: "groups-table" },
  );
}

function groupDetail(g) {
  const queues = g.queues.slice().sort((a, b) =>
    `${a.topic}\u0000${a.broker_name}`.localeCompare(`${b.topic}\u0000${b.broker_name}`) || a.queue_id - b.queue_id,
  );
  return h(
    "div",
    { class: "detail" },
    h(
      "dl",
      { class: "props" },
      h("dt", {}, "Online members"),
      h("dd", {}, list(g.members, (m) => m, "no consumer of this group is online")),
      h("dt", {}, "Total lag"),
      h("dd", {}, lagText(g.total_lag)),
    ),
    table(
      [
        { label: "Topic", value: (q) => q.topic },
        { label: "Broker", value: (q) => q.broker_name },
        { label: "Queue", value: (q) => q.queue_id, num: true },
        { label: "Broker offset", value: (q) => fmtInt(q.broker_offset), num: true },
        { label: "Consumer offset", value: (q) => fmtInt(q.consumer_offset), num: true },
        { label: "Lag", value: (q) => lagText(q.lag), num: true },
      ],
      queues,
      "This group has no committed offsets yet.",
    ),
  );
}

const lagText = (lag) => h("span", { class: lag > 0 ? "lag" : "" }, fmtInt(lag));

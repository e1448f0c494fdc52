// Overview: totals, throughput and lag over the last minutes, the nodes and the groups
// (members, roles, SyncStateSet, epochs, confirm offset).

import { getAll } from "../api.js";
import { TimeChart } from "../charts.js";
import { h, replace, section, table, badge, roleBadge, fmtInt, fmtRate, list, errorBox } from "../dom.js";

const HISTORY_AGE_S = 600;

export function mount(root) {
  const totals = h("div", { class: "totals" });
  const throughput = new TimeChart("Throughput (messages/s)");
  const lag = new TimeChart("Consumer lag (messages)", { whole: true });
  const nodes = h("div");
  const groups = h("div");
  root.append(
    totals,
    h("section", { class: "card charts" }, h("h2", {}, "Last 10 minutes"), h("div", { class: "chart-row" }, throughput.el, lag.el)),
    section("Broker groups", groups),
    section("Nodes", nodes),
  );

  async function refresh() {
    const r = await getAll({
      overview: "/api/overview",
      history: `/api/history?age_s=${HISTORY_AGE_S}`,
      nodes: "/api/nodes",
      groups: "/api/groups",
    });
    renderTotals(totals, r.overview);
    if (r.history.data) {
      const s = r.history.data.series;
      throughput.update({ published: s.publish_rate, delivered: s.deliver_rate });
      lag.update({ lag: s.lag });
    }
    replace(nodes, r.nodes.error ? errorBox(r.nodes.error) : nodeTable(r.nodes.data));
    replace(groups, r.groups.error ? errorBox(r.groups.error) : groupTable(r.groups.data));
    const failed = Object.values(r).find((x) => x.error);
    if (failed) throw failed.error;
  }
  return { refresh };
}

function card(label, value, hint) {
  return h("div", { class: "total" }, h("div", { class: "total-value" }, value ?? "—"), h("div", { class: "total-label" }, label), hint ? h("div", { class: "total-hint" }, hint) : null);
}

function words(key) {
  const s = key.replace(/_/g, " ");
  return s.charAt(0).toUpperCase() + s.slice(1);
}

function renderTotals(el, overview) {
  if (overview.error) return replace(el, errorBox(overview.error));
  const o = overview.data;
  const stats = o.message_stats;
  const queues = o.queue_totals;
  replace(
    el,
    card("Cluster", o.cluster_name),
    card("Nodes", fmtInt(o.node_count)),
    Object.entries(o.object_totals).map(([k, v]) => card(words(k), fmtInt(v))),
    card("Messages stored", fmtInt(queues.messages)),
    card("Consumer lag", fmtInt(queues.lag)),
    card("Publish rate", fmtRate(stats.publish_details.rate), `${fmtInt(stats.publish)} in all`),
    card("Deliver rate", fmtRate(stats.deliver_get_details.rate), `${fmtInt(stats.deliver_get)} in all`),
  );
}

function nodeTable(nodes) {
  return table(
    [
      { label: "Node", value: (n) => h("strong", {}, n.name) },
      { label: "Address", value: (n) => n.address },
      { label: "State", value: (n) => (n.running ? badge("running", "ok") : badge("down", "bad")) },
      { label: "Members (group#id)", value: (n) => list(n.members, (m) => `${m.broker_name}#${m.broker_id}`) },
    ],
    nodes,
    "No nodes have registered yet. Start one with `hamq dev` or `hamq node`.",
  );
}

function groupTable(groups) {
  return table(
    [
      { label: "Group", value: (g) => h("strong", {}, g.broker_name) },
      {
        label: "Members (id address role)",
        value: (g) =>
          h(
            "div",
            { class: "members" },
            g.members.map((m) =>
              h(
                "div",
                { class: m.alive ? "" : "down", title: m.error || "" },
                h("code", {}, `#${m.broker_id}`), " ", m.addr, " ",
                m.alive ? roleBadge(m.role) : badge("down", "bad"),
                m.in_sync ? h("span", { class: "in-sync", title: "in the SyncStateSet" }, " ✓") : null,
              ),
            ),
          ),
      },
      { label: "SyncStateSet", value: (g) => (g.sync_state_set ? list(g.sync_state_set, (id) => `#${id}`) : h("span", { class: "muted" }, g.mode)) },
      { label: "Master epoch", value: (g) => fmtInt(g.master_epoch), num: true },
      { label: "SSS epoch", value: (g) => fmtInt(g.sync_state_set_epoch), num: true },
      { label: "Confirm offset", value: (g) => fmtInt(g.confirm_offset), num: true },
    ],
    groups,
    "No broker groups yet: a group appears once its first member registers.",
  );
}

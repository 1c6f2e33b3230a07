// Tool views: the recall playground, the working context, and the server.
import { t } from "./i18n.js";
import { api, h, fmtNum, fmtTime, field, showError, status } from "./core.js";

const enc = encodeURIComponent;

// -- Recall playground ---------------------------------------------------------------------
function hitTable(rows, testid, extra) {
  return h("table", { "data-test": testid },
    h("tr", {}, [t("text"), t("tier"), t("score"), extra ? t(extra) : t("removed_by")].map((x) => h("th", {}, x))),
    rows.map((r) => h("tr", { class: r.removed ? "removed" : null, "data-test": "hit", "data-id": r.id },
      h("td", {}, r.text), h("td", {}, t("tier_" + r.tier)), h("td", { class: "num" }, fmtNum(r.score, 4)),
      h("td", { class: "why" }, extra === "ranks" ? ranks(r) : (r.removed ? t("rm_" + r.removed) : "")))));
}

// "lexical / vector" ranks of a fused row; with one vector leg per model, "lexical / a · b".
function ranks(r) {
  const vector = r.vector_ranks.length ? r.vector_ranks.map((x) => x ?? "—").join(" · ") : "—";
  return `${r.lexical_rank ?? "—"} / ${vector}`;
}

function vectorLeg(leg, several) {
  const title = several ? `${t("vector_leg")} — ${leg.model}` : t("vector_leg");
  return h("div", { "data-test": "vector-leg", "data-model": leg.model },
    h("h3", {}, title, ` (${leg.hits.filter((x) => !x.removed).length}, cos ≥ ${leg.threshold})`), hitTable(leg.hits, "leg-vector"));
}

// The cosine threshold of each vector leg (each model has its own), or the setting's.
function cosines(r) {
  if (r.vector_legs.length > 1) return r.vector_legs.map((leg) => `${leg.model} cos ≥ ${leg.threshold}`).join(", ");
  return `cos ≥ ${r.vector_legs.length ? r.vector_legs[0].threshold : r.thresholds.cosine}`;
}

export async function recall(box, ctx) {
  const p = ctx.params;
  const q = h("input", { type: "search", name: "query", value: p.get("query") || "", size: 40, "data-test": "recall-query" });
  const time = h("input", { type: "text", name: "time", value: p.get("time") || "", placeholder: t("time_placeholder"), "data-test": "recall-time" });
  const run = () => ctx.go("recall", Object.fromEntries(Object.entries({ query: q.value, time: time.value }).filter(([, v]) => v)));
  q.addEventListener("keydown", (e) => { if (e.key === "Enter") run(); });
  box.append(h("h2", {}, t("view_recall"), " — ", ctx.name),
    h("div", { class: "filters" }, field(t("query"), q), field(t("time_box"), time), h("button", { type: "button", "data-test": "recall-run", onclick: run }, t("search"))));
  if (!p.get("query") && !p.get("time")) { box.append(h("p", { class: "muted" }, t("recall_help"))); return; }
  const r = await api("POST", `/api/browse/${enc(ctx.name)}/recall_explain`, { query: p.get("query") || "", time: p.get("time") || "" });
  const facts = [
    [t("indexed"), r.indexed], [t("in_window"), r.in_window ?? t("no_window")],
    [t("window"), r.window ? `${r.window.start} → ${r.window.end}` : (r.time_understood === false ? t("time_not_understood") : "—")],
    [t("time_hint"), r.query_time_hint ? `${r.query_time_hint.start} → ${r.query_time_hint.end}` : "—"],
    [t("vector_leg"), r.vector_state], [t("thresholds"), `BM25 ≥ ${r.thresholds.bm25}, ${cosines(r)}, ${t("budget")} ${r.thresholds.budget_each}/${r.thresholds.budget_total}, RRF k=${r.thresholds.rrf_k}`],
    [t("elapsed"), `${r.elapsed_ms} ms`],
  ];
  box.append(h("div", { class: "kv", "data-test": "recall-summary" }, facts.flatMap(([k, v]) => [h("span", { class: "muted" }, k), h("span", {}, String(v))])));
  box.append(h("div", { class: r.vector_legs.length > 1 ? "legs four" : "legs" },
    h("div", {}, h("h3", {}, t("lexical_leg"), ` (${r.lexical.filter((x) => !x.removed).length})`), hitTable(r.lexical, "leg-lexical")),
    r.vector_legs.map((leg) => vectorLeg(leg, r.vector_legs.length > 1)),
    h("div", {}, h("h3", {}, t("fused"), ` (${r.fused.length})`), hitTable(r.fused, "fused", "ranks"))));
  box.append(h("h3", {}, t("hard_filtered"), ` (${r.hard_filtered.length})`),
    h("table", { "data-test": "hard-filtered" }, h("tr", {}, [t("text"), t("tier"), t("score"), t("reason")].map((x) => h("th", {}, x))),
      r.hard_filtered.map((x) => h("tr", {}, h("td", {}, x.text), h("td", {}, t("tier_" + x.tier)), h("td", { class: "num" }, fmtNum(x.score, 4)), h("td", {}, x.reason)))));
}

// -- Working context -----------------------------------------------------------------------
export async function context(box, ctx) {
  const r = await api("GET", `/api/browse/${enc(ctx.name)}/context`);
  box.append(h("h2", {}, t("view_context"), " — ", ctx.name), h("p", { class: "muted" }, t("context_help"), ` ${r.tokens} ${t("tokens")} (${r.encoding})`));
  box.append(h("table", { "data-test": "context-budget" }, h("tr", {}, [t("section"), t("tokens"), t("budget"), ""].map((x) => h("th", {}, x))),
    r.sections.map((s) => {
      const share = s.budget ? Math.min(1, s.tokens / s.budget) : 0;
      const bar = h("span", { class: "bar" + (s.budget && s.tokens > s.budget ? " over" : "") }, h("span", {}));
      bar.firstChild.style.width = `${(share * 100).toFixed(1)}%`;
      return h("tr", { "data-test": "context-section", "data-section": s.section, "data-tokens": s.tokens },
        h("td", {}, t("sec_" + s.section)), h("td", { class: "num" }, s.tokens), h("td", { class: "num" }, s.budget ?? "—"), h("td", {}, s.budget ? bar : ""));
    })));
  const pre = h("pre", { class: "context", "data-test": "context-text" });
  for (const s of r.sections) pre.append(h("span", { class: "section-" + s.section, title: t("sec_" + s.section) }, s.text));
  box.append(pre);
}

// -- Server --------------------------------------------------------------------------------
function sentence(health) {
  const parts = [];
  parts.push(health.limited_mode ? t("h_limited").replace("{reason}", health.blocking_reason) : t("h_ok").replace("{version}", health.version));
  parts.push(t("h_active").replace("{n}", health.active_characters));
  const emb = health.embeddings;
  parts.push(t("h_emb").replace("{state}", t("emb_" + emb.state) || emb.state).replace("{model}", emb.model || "—").replace("{pending}", emb.pending));
  parts.push(t("h_jobs").replace("{n}", health.model_jobs));
  return parts;
}

export async function server(box, ctx) {
  const [health, powerful] = await Promise.all([api("GET", "/health"), api("GET", "/api/memory/powerful_memory_config").catch(() => null)]);
  box.append(h("h2", {}, t("view_server")));
  box.append(h("ul", { "data-test": "health-words" }, sentence(health).map((s) => h("li", {}, s))));
  const tiers = Object.entries(health.llm.tiers || {});
  // The error column shows the current error only; one a later answer cleared is marked old.
  const errorCell = (s) => s.last_error
    ? h("td", { class: "warn", "data-test": "tier-error" }, `${t("failing_since")} ${fmtTime(s.failing_since)}: ${s.last_error}`)
    : h("td", { class: "muted", "data-test": "tier-error" }, s.recovered_error ? `${t("recovered")}: ${s.recovered_error}` : "—");
  box.append(h("h3", {}, t("model_tiers")), h("table", { "data-test": "tiers" },
    h("tr", {}, [t("tier"), t("tier_state"), t("model"), t("calls"), t("failures"), t("last_success"), t("last_error")].map((x) => h("th", {}, x))),
    tiers.map(([name, s]) => h("tr", { "data-test": "tier-row", "data-tier": name, "data-state": s.state },
      h("td", {}, name), h("td", { class: s.state === "failing" ? "warn" : s.state === "ok" ? "ok" : "muted" }, t("ts_" + s.state) || s.state),
      h("td", {}, s.model || "—"), h("td", { class: "num" }, s.calls), h("td", { class: "num" }, s.failures), h("td", {}, fmtTime(s.last_success_at)), errorCell(s)))));
  for (const w of health.llm.config_warnings || []) box.append(h("p", { class: "warn", "data-test": "config-warning" }, w));
  const sup = health.supervision || {};
  box.append(h("h3", {}, t("supervision")), h("div", { class: "kv", "data-test": "supervision" },
    Object.entries(sup).flatMap(([k, v]) => [h("span", { class: "muted" }, t("sup_" + k) || k), h("span", {}, typeof v === "object" ? JSON.stringify(v) : String(v))])));
  if (powerful) {
    const cb = h("input", { type: "checkbox", "data-test": "powerful-switch", checked: powerful.enabled, onchange: async (e) => {
      try { const r = await api("POST", "/api/memory/powerful_memory_config", { enabled: e.target.checked }); status(`${t("saved")}: ${r.enabled}`, "ok"); }
      catch (err) { showError(err); e.target.checked = !e.target.checked; }
    } });
    box.append(h("h3", {}, t("powerful_memory")), h("p", {}, h("label", {}, cb, " ", t("powerful_switch"))), h("p", { class: "muted" }, t("powerful_help")));
  }
}

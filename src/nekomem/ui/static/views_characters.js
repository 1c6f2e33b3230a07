// The character list's own parts: where each character came from (origin.json: when, through
// which route, from which kind of client; renames and merges since) and the operator's
// "Rename" and "Merge into" (POST /api/characters/{name}/rename | merge). README/docs:
// docs/CHARACTERS.md.
import { currentLang } from "./i18n.js";
import { api, h, fmtTime, modal, showError, status } from "./core.js";

const enc = encodeURIComponent;
const LANGS = ["en", "zh", "ja"];

// key: [English, 中文, 日本語]; {x} is filled in.
const TEXT = {
  created: ["created {time} through {route}", "创建于 {time}，经由 {route}", "{time} に {route} で作成"],
  client: ["by {client}", "来自 {client}", "クライアント {client}"],
  origin_unknown: ["origin not recorded (made before nekomem kept it, or imported)", "未记录来源（创建早于 nekomem 记录来源，或为导入）", "作成元の記録なし（記録を始める前の作成、またはインポート）"],
  renamed: ["renamed from {name} ({time})", "由 {name} 改名（{time}）", "{name} から改名（{time}）"],
  merged: ["{name} merged in ({time})", "已并入 {name}（{time}）", "{name} を統合（{time}）"],
  rename: ["Rename", "改名", "名前を変更"],
  merge: ["Merge into…", "合并到…", "統合先…"],
  cancel: ["Cancel", "取消", "キャンセル"],
  rename_title: ["Rename {name}", "为 {name} 改名", "{name} の名前を変更"],
  rename_help: ["Every layer moves to the new name (conversation, facts, reflections, persona, pending work). The new name must not be a character yet: to join two characters, merge.",
    "所有层都会移到新名字下（对话、事实、反思、人设、待处理任务）。新名字不能已是角色；要合并两个角色，请用“合并”。",
    "すべての層（会話・事実・リフレクション・ペルソナ・保留中の処理）が新しい名前に移ります。新しい名前は既存のキャラクターであってはいけません。2 つをまとめるには統合してください。"],
  merge_title: ["Merge {name} into another character", "将 {name} 合并到另一个角色", "{name} を別のキャラクターに統合"],
  merge_help: ["Its conversation joins the other's in time order; its facts, reflections and persona entries are added; then {name} is removed. It cannot be undone (make a backup first: nekomem backup).",
    "它的对话按时间并入另一个角色，事实、反思和人设条目被加入，然后删除 {name}。无法撤销（请先备份：nekomem backup）。",
    "会話は時刻順に相手の会話へ加わり、事実・リフレクション・ペルソナ項目が追加され、その後 {name} は削除されます。元に戻せません（先にバックアップ：nekomem backup）。"],
  new_name: ["New name", "新名字", "新しい名前"], into: ["Into", "合并到", "統合先"],
  renamed_done: ["Renamed {old} to {name}.", "已将 {old} 改名为 {name}。", "{old} を {name} に改名しました。"],
  merged_done: ["Merged {old} into {name}.", "已将 {old} 合并到 {name}。", "{old} を {name} に統合しました。"],
};

function tx(key, vars = {}) {
  const row = TEXT[key];
  const s = row ? row[LANGS.indexOf(currentLang())] || row[0] : key;
  return s.replace(/\{(\w+)\}/g, (_, k) => String(vars[k] ?? ""));
}

// The lines under a character's name: its origin, then its renames and merges.
export function originNote(c) {
  const o = c.origin;
  const lines = [];
  if (!o || !o.created_at) lines.push(tx("origin_unknown"));
  else lines.push(tx("created", { time: fmtTime(o.created_at), route: o.route }) + (o.client ? " " + tx("client", { client: o.client }) : ""));
  for (const r of (o && o.renamed_from) || []) lines.push(tx("renamed", { name: r.name, time: fmtTime(r.at) }));
  for (const m of (o && o.merged_from) || []) lines.push(tx("merged", { name: m.name, time: fmtTime(m.at) }));
  return h("div", { class: "origin muted", "data-test": "character-origin" }, lines.map((x) => h("div", {}, x)));
}

// A modal dialog with one field; resolves to its value, or null when cancelled.
function ask(title, help, label, input, action) {
  const body = [h("h3", {}, title), h("p", { class: "muted" }, help), h("p", {}, h("label", {}, label, " ", input))];
  return modal("move", body, action, tx("cancel"), () => input.value.trim() || null, null, input);
}

async function moved(ctx, old, name, key) {
  if (localStorage.getItem("nekomem.character") === old) localStorage.setItem("nekomem.character", name);
  await ctx.reloadCharacters();
  await ctx.refresh();
  status(tx(key, { old, name }), "ok");
}

// "Rename" and "Merge into…" for one row of /api/browse/characters (``all``: every name).
export function moveButtons(ctx, c, all) {
  const rename = h("button", { type: "button", "data-test": "rename-character", onclick: async () => {
    const input = h("input", { type: "text", value: c.name, "data-test": "rename-to", maxlength: 50 });
    const to = await ask(tx("rename_title", { name: c.name }), tx("rename_help"), tx("new_name"), input, tx("rename"));
    if (!to || to === c.name) return;
    try { const r = await api("POST", `/api/characters/${enc(c.name)}/rename`, { to }); await moved(ctx, c.name, r.name, "renamed_done"); }
    catch (e) { showError(e); }
  } }, tx("rename"));
  const others = all.filter((n) => n !== c.name);
  const merge = h("button", { type: "button", class: "danger", "data-test": "merge-character", disabled: !others.length, onclick: async () => {
    const input = h("select", { "data-test": "merge-into" }, others.map((n) => h("option", { value: n }, n)));
    const into = await ask(tx("merge_title", { name: c.name }), tx("merge_help", { name: c.name }), tx("into"), input, tx("merge"));
    if (!into) return;
    try { const r = await api("POST", `/api/characters/${enc(c.name)}/merge`, { into }); await moved(ctx, c.name, r.name, "merged_done"); }
    catch (e) { showError(e); }
  } }, tx("merge"));
  return [rename, merge];
}

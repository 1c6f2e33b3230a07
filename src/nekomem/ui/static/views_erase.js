// Forgetting from the memory browser: "forget this" (a fact, a reflection, a persona entry,
// a stored turn, a range of stored turns) and "delete this character". Each asks first in a
// dialog that names what goes; the server then removes every copy (README, "Forgetting").
import { currentLang } from "./i18n.js";
import { api, h, fmtTime, modal, showError, status } from "./core.js";

const enc = encodeURIComponent;
const LANGS = ["en", "zh", "ja"];

// key: [English, 中文, 日本語]; {x} is filled in.
const TEXT = {
  forget: ["Forget", "遗忘", "忘れる"],
  delete_character: ["Delete character", "删除角色", "キャラクターを削除"],
  cancel: ["Cancel", "取消", "キャンセル"],
  forget_range: ["Forget the turns in this range", "遗忘此范围内的对话", "この範囲の会話を忘れる"],
  title_fact: ["Forget this fact?", "遗忘这条事实？", "この事実を忘れますか？"],
  title_reflection: ["Forget this reflection?", "遗忘这条反思？", "このリフレクションを忘れますか？"],
  title_persona: ["Forget this persona entry?", "遗忘这条人设？", "このペルソナ項目を忘れますか？"],
  title_turn: ["Forget this stored turn?", "遗忘这条对话？", "この会話を忘れますか？"],
  title_range: ["Forget {n} stored turns?", "遗忘 {n} 条对话？", "{n} 件の会話を忘れますか？"],
  title_character: ["Delete the character {name}?", "删除角色 {name}？", "キャラクター {name} を削除しますか？"],
  goes: ["What goes, with every copy the server keeps of it (journal, edit history, pending work, archives):",
    "将被删除的内容，以及服务器保存的所有副本（日志、编辑历史、待处理任务、归档）：",
    "削除されるもの（サーバーが保持するすべての複製：ジャーナル・編集履歴・保留中の処理・アーカイブを含む）："],
  stays_fact: ["The turns it was learned from, and reflections built on it, stay: forget them on their own.",
    "它所来自的对话以及基于它的反思会保留；如需删除请分别遗忘。",
    "元になった会話と、それをもとにしたリフレクションは残ります。必要なら個別に忘れてください。"],
  stays_reflection: ["A persona entry promoted from it, and the facts it was built from, stay: forget them on their own.",
    "由它晋升的人设条目以及它所依据的事实会保留；如需删除请分别遗忘。",
    "ここから昇格したペルソナ項目と、元になった事実は残ります。必要なら個別に忘れてください。"],
  stays_persona: ["Queued contradictions about it go too.", "与它相关的待处理矛盾也会删除。", "これに関する保留中の矛盾も削除されます。"],
  stays_turn: ["Facts and reflections learned from it before, and the summary memo, stay: forget them on their own.",
    "此前由它得出的事实、反思以及摘要备忘会保留；如需删除请分别遗忘。",
    "これまでにそこから得られた事実・リフレクション・要約メモは残ります。必要なら個別に忘れてください。"],
  stays_character: ["This removes the character's whole folder. It cannot be undone (make a backup first: nekomem backup).",
    "这会删除该角色的整个文件夹，无法撤销（请先备份：nekomem backup）。",
    "キャラクターのフォルダーをすべて削除します。元に戻せません（先にバックアップ：nekomem backup）。"],
  c_turns: ["{n} stored turns", "{n} 条对话", "会話 {n} 件"], c_facts: ["{n} facts", "{n} 条事实", "事実 {n} 件"],
  c_reflections: ["{n} reflections", "{n} 条反思", "リフレクション {n} 件"], c_persona: ["{n} persona entries", "{n} 条人设", "ペルソナ {n} 件"],
  c_recent: ["{n} items of the recent window", "近期记忆 {n} 项", "最近の記憶 {n} 項目"],
  forgotten: ["Forgotten.", "已遗忘。", "忘れました。"], deleted: ["Deleted {name}.", "已删除 {name}。", "{name} を削除しました。"],
};

export function tx(key, vars = {}) {
  const row = TEXT[key];
  const s = row ? row[LANGS.indexOf(currentLang())] || row[0] : key;
  return s.replace(/\{(\w+)\}/g, (_, k) => String(vars[k] ?? ""));
}

// A modal dialog naming what goes; resolves true when confirmed.
export function confirmErase(title, items, note, action) {
  const body = [
    h("h3", { "data-test": "erase-title" }, title),
    h("p", {}, tx("goes")),
    h("ul", { "data-test": "erase-items" }, items.map((x) => h("li", {}, x))),
    h("p", { class: "muted", "data-test": "erase-note" }, note),
  ];
  return modal("erase", body, action, tx("cancel"), () => true, false);
}

const LAYER = { fact: "facts", reflection: "reflections", persona: "persona" };

// "Forget" for one fact, reflection or persona entry (``text``: what the dialog shows).
export function forgetEntryButton(ctx, kind, id, text) {
  return h("button", { type: "button", class: "danger", "data-test": "forget", onclick: async () => {
    if (!(await confirmErase(tx("title_" + kind), [text], tx("stays_" + kind), tx("forget")))) return;
    try {
      await api("DELETE", `/api/characters/${enc(ctx.name)}/${LAYER[kind]}/${enc(id)}`);
      await ctx.refresh();
      status(tx("forgotten"), "ok");
    } catch (e) { showError(e); }
  } }, tx("forget"));
}

// "Forget" for one stored turn (a journal row).
export function forgetTurnButton(ctx, row) {
  return h("button", { type: "button", class: "danger", "data-test": "forget-turn", onclick: async () => {
    const item = `${fmtTime(row.ts)} — ${row.text}`;
    if (!(await confirmErase(tx("title_turn"), [item], tx("stays_turn"), tx("forget")))) return;
    try {
      await api("DELETE", `/api/characters/${enc(ctx.name)}/turns/${row.id}`);
      await ctx.refresh();
      status(tx("forgotten"), "ok");
    } catch (e) { showError(e); }
  } }, tx("forget"));
}

// "Forget the turns in this range" under a journal filtered by time (``total`` turns).
export function forgetRangeButton(ctx, since, until, total) {
  return h("button", { type: "button", class: "danger", "data-test": "forget-range", disabled: !total, onclick: async () => {
    const item = `${fmtTime(since)} → ${fmtTime(until)}`;
    if (!(await confirmErase(tx("title_range", { n: total }), [item], tx("stays_turn"), tx("forget")))) return;
    try {
      const r = await api("DELETE", `/api/characters/${enc(ctx.name)}/turns?from=${enc(since)}&to=${enc(until)}`);
      await ctx.refresh();
      status(`${tx("forgotten")} (${r.forgotten})`, "ok");
    } catch (e) { showError(e); }
  } }, tx("forget_range"));
}

// "Delete character" in the characters table (``c``: a row of /api/browse/characters).
export function deleteCharacterButton(ctx, c) {
  return h("button", { type: "button", class: "danger", "data-test": "delete-character", onclick: async () => {
    const refl = Object.values(c.counts.reflections || {}).reduce((a, b) => a + b, 0);
    const items = [
      tx("c_turns", { n: c.turns }), tx("c_recent", { n: c.counts.recent }), tx("c_facts", { n: c.counts.facts + (c.counts.facts_archived || 0) }),
      tx("c_reflections", { n: refl }), tx("c_persona", { n: c.counts.persona }),
    ];
    if (!(await confirmErase(tx("title_character", { name: c.name }), items, tx("stays_character"), tx("delete_character")))) return;
    try {
      await api("DELETE", `/api/characters/${enc(c.name)}`);
      if (localStorage.getItem("nekomem.character") === c.name) localStorage.removeItem("nekomem.character");
      await ctx.reloadCharacters();
      await ctx.refresh();
      status(tx("deleted", { name: c.name }), "ok");
    } catch (e) { showError(e); }
  } }, tx("delete_character"));
}

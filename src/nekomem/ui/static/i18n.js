// Interface text in English, Chinese and Japanese; the browser's language picks one, the
// header's switch overrides it (kept in localStorage).
const LANG_KEY = "nekomem.lang";

// key: [English, 中文, 日本語]
const TEXT = {
  character: ["Character", "角色", "キャラクター"],
  language: ["Language", "语言", "言語"],
  token: ["API token", "API 令牌", "API トークン"],
  token_prompt: ["Bearer token (kept for this tab only)", "Bearer 令牌（仅保存在此标签页）", "Bearer トークン（このタブにのみ保存）"],
  need_token: ["The server asks for an API token: enter it with the “API token” button.", "服务器需要 API 令牌：请点击“API 令牌”按钮输入。", "サーバーが API トークンを求めています。「API トークン」ボタンから入力してください。"],
  wrong_token: ["The server refused this API token: check it (NEKOMEM_API_TOKEN) and enter it again.", "服务器拒绝了此 API 令牌：请核对（NEKOMEM_API_TOKEN）后重新输入。", "サーバーがこの API トークンを拒否しました。NEKOMEM_API_TOKEN を確認して入力し直してください。"],
  server_down: ["The nekomem server cannot be reached: is it running (make serve)? Reload the page once it is.", "无法连接 nekomem 服务器：它在运行吗（make serve）？启动后请刷新页面。", "nekomem サーバーに接続できません。起動していますか（make serve）？起動したらページを再読み込みしてください。"],
  no_model_banner: ["No language model is configured: conversations are stored and recalled, but no facts or reflections will appear until one is (NEKOMEM_LLM_BASE_URL, NEKOMEM_LLM_MODEL).", "未配置语言模型：对话会被存储和召回，但在配置模型之前不会生成事实和反思（NEKOMEM_LLM_BASE_URL、NEKOMEM_LLM_MODEL）。", "言語モデルが設定されていません。会話は保存・想起されますが、設定するまで事実やリフレクションは作られません（NEKOMEM_LLM_BASE_URL、NEKOMEM_LLM_MODEL）。"],
  model_failing_banner: ["The language model is failing ({tiers}): new facts and summaries wait until it answers again; conversations are still stored. See Server.", "语言模型出错（{tiers}）：新的事实与摘要会等待它恢复；对话仍会被存储。详见“服务器”。", "言語モデルが失敗しています（{tiers}）。回復するまで新しい事実や要約は待機しますが、会話は保存されます。「サーバー」を参照してください。"],
  empty_facts: ["No facts yet: the model extracts them from the conversation after a few turns (or import them).", "尚无事实：模型会在几轮对话后从中提取（也可以导入）。", "事実はまだありません。数回の会話の後にモデルが会話から抽出します（インポートも可能）。"],
  empty_filtered: ["No fact matches these filters.", "没有符合这些筛选条件的事实。", "この条件に合う事実はありません。"],
  empty_pending: ["No pending reflections: they are synthesised from several related facts.", "没有待定的反思：它们由多条相关事实综合而成。", "保留中のリフレクションはありません。関連する複数の事実から合成されます。"],
  empty_confirmed: ["None confirmed yet: a reflection is confirmed by you or by later evidence.", "尚无已确认：反思由你或之后的证据确认。", "確認済みはまだありません。あなたの確認か後の根拠で確認されます。"],
  empty_promoted: ["None promoted yet: a long-confirmed reflection becomes persona.", "尚无晋升：长期确认的反思会成为人设。", "昇格済みはまだありません。長く確認されたリフレクションはペルソナになります。"],
  empty_denied: ["None denied.", "没有被否认的反思。", "否定されたものはありません。"],
  empty_archived: ["None archived: faded or merged reflections go here.", "没有归档：淡化或合并的反思会出现在这里。", "アーカイブはありません。薄れたり統合されたリフレクションがここに入ります。"],
  empty_persona: ["No persona entries yet: add one below the title, import a character card, or let stable reflections be promoted.", "尚无人设条目：可在标题下方添加、导入角色卡，或等待稳定的反思晋升。", "ペルソナ項目はまだありません。タイトルの下で追加するか、キャラクターカードをインポートするか、安定したリフレクションの昇格を待ってください。"],
  persona_add: ["Add entry", "添加条目", "項目を追加"], persona_empty: ["Write the entry's text first.", "请先填写条目文本。", "先に項目のテキストを書いてください。"],
  subj_group_chat: ["Group chat {id}", "群聊 {id}", "グループチャット {id}"], subj_participant: ["Participant {id}", "参与者 {id}", "参加者 {id}"],
  subj_group_participant: ["Group member {id}", "群成员 {id}", "グループメンバー {id}"],
  save: ["Save", "保存", "保存"], saved: ["Saved", "已保存", "保存しました"], error: ["Error", "错误", "エラー"],
  view_characters: ["Characters", "角色", "キャラクター"], view_recent: ["Recent", "近期", "最近"], view_journal: ["Journal", "对话日志", "会話ログ"],
  view_facts: ["Facts", "事实", "事実"], view_reflections: ["Reflections", "反思", "リフレクション"], view_persona: ["Persona", "人设", "ペルソナ"],
  view_knowledge: ["Public knowledge", "公共知识", "公開知識"],
  knowledge_help: ["Knowledge packs shared by every character: third-party reference cards the chat server's query_public_knowledge tool looks up.", "所有角色共用的知识包：聊天服务器的 query_public_knowledge 工具查询的第三方参考卡片。", "全キャラクター共通の知識パック。チャットサーバーの query_public_knowledge ツールが参照する第三者の参考カードです。"],
  knowledge_switch: ["Public knowledge on", "启用公共知识", "公開知識を有効にする"],
  knowledge_playground: ["Query playground", "查询试验场", "クエリ・プレイグラウンド"],
  knowledge_playground_help: ["What the chat server's tool would receive for this query.", "聊天服务器的工具对此查询会收到的内容。", "このクエリでチャットサーバーのツールが受け取る内容です。"],
  tool_available: ["Tool offered", "工具可用", "ツール提供"], packs: ["Packs", "知识包", "パック"], pack: ["Pack", "知识包", "パック"],
  jobs: ["Import jobs", "导入任务", "インポートジョブ"], entries: ["Entries", "条目", "エントリ"], vectors: ["Vectors", "向量", "ベクトル"],
  material: ["Type", "类型", "種類"], auto_context: ["Auto context", "自动上下文", "自動コンテキスト"],
  local_vectors: ["Local vectors", "本地向量", "ローカルベクトル"], remove: ["Remove", "移除", "削除"], confirm_remove: ["Click again to remove", "再点一次以移除", "もう一度クリックで削除"],
  import_pack: ["Pack file", "知识包文件", "パックファイル"], import: ["Import", "导入", "インポート"], choose_pack: ["Choose a pack file first.", "请先选择知识包文件。", "先にパックファイルを選んでください。"],
  pack_unchanged: ["This version is already installed.", "此版本已安装。", "このバージョンはインストール済みです。"],
  refused: ["Refused", "被拒绝", "拒否されました"], job_state: ["State", "状态", "状態"], progress: ["Progress", "进度", "進捗"],
  updated: ["Updated", "更新时间", "更新"], cancel: ["Cancel", "取消", "キャンセル"], discard: ["Discard", "清除", "破棄"],
  all_packs: ["All packs", "全部知识包", "すべてのパック"], title: ["Title", "标题", "タイトル"], summary: ["Summary", "摘要", "要約"],
  disabled: ["Disabled", "已停用", "無効"], mode: ["Mode", "模式", "モード"], result: ["Result", "结果", "結果"],
  retrieval: ["Retrieval", "检索方式", "検索方式"], hits: ["Hits", "命中", "ヒット"],
  mt_knowledge: ["knowledge", "知识", "知識"], mt_corpus: ["corpus", "语料", "コーパス"],
  vs_none: ["none", "无", "なし"], vs_off: ["off", "关闭", "オフ"], vs_complete: ["complete", "完成", "完了"], vs_paused: ["paused", "暂停", "一時停止"],
  vs_waiting: ["waiting for the model", "等待模型", "モデル待ち"], vs_partial: ["partial", "部分", "一部"], vs_building: ["building", "计算中", "計算中"],
  js_queued: ["queued", "排队中", "待機中"], js_building: ["building", "构建中", "構築中"], js_active: ["active", "已生效", "有効"],
  js_failed: ["failed", "失败", "失敗"], js_cancelled: ["cancelled", "已取消", "キャンセル済み"],
  view_recall: ["Recall playground", "召回试验场", "想起プレイグラウンド"], view_context: ["Working context", "工作上下文", "作業コンテキスト"], view_server: ["Server", "服务器", "サーバー"],
  no_character: ["Choose a character first (none is stored yet).", "请先选择角色（尚无存储的角色）。", "先にキャラクターを選んでください（まだ保存されていません）。"],
  no_characters: ["No character is stored yet.", "尚无存储的角色。", "保存されたキャラクターはまだありません。"],
  name: ["Name", "名称", "名前"], state: ["State", "状态", "状態"], turns: ["Turns", "对话条数", "発話数"], recent: ["Recent", "近期", "最近"],
  facts: ["Facts", "事实", "事実"], facts_archived: ["Archived facts", "已归档事实", "アーカイブ済み事実"],
  vectors_pending: ["Waiting for vectors", "等待向量", "ベクトル待ち"],
  fact_backlog: ["Turns not yet mined for facts", "尚未提取事实的对话", "事実抽出待ちの発言"], reflections: ["Reflections", "反思", "リフレクション"],
  persona: ["Persona", "人设", "ペルソナ"], corrections: ["Contradiction queue", "矛盾队列", "矛盾キュー"], last_conversation: ["Last conversation", "最近对话", "最後の会話"],
  storage: ["Storage", "存储", "ストレージ"], no_trouble: ["fine", "正常", "正常"], active: ["active", "活跃", "稼働中"], passive: ["passive", "休眠", "休止中"],
  review_switch: ["Review the recent window automatically", "自动审阅近期记忆", "最近の記憶を自動で見直す"],
  review_help: ["Applies to every character (core_config.json).", "对所有角色生效（core_config.json）。", "すべてのキャラクターに適用されます（core_config.json）。"],
  recent_stored: ["Turns stored in total:", "累计存储的对话：", "保存済みの発話の合計："],
  memo: ["memo", "备忘", "メモ"], role: ["Role", "角色", "役割"], time: ["Time", "时间", "時刻"], text: ["Text", "文本", "テキスト"],
  role_human: ["user", "用户", "ユーザー"], role_ai: ["character", "角色", "キャラクター"], role_system: ["system", "系统", "システム"], role_unreadable: ["unreadable", "无法读取", "読めません"],
  edit: ["Edit", "编辑", "編集"], delete: ["Delete", "删除", "削除"], confirm_delete: ["Delete this entry? The change is journaled.", "删除此条目？该操作会记入日志。", "この項目を削除しますか？変更はジャーナルに記録されます。"],
  nothing: ["Nothing here.", "暂无内容。", "何もありません。"], previous: ["Previous", "上一页", "前へ"], next: ["Next", "下一页", "次へ"],
  since: ["From", "起始", "開始"], until: ["To", "结束", "終了"], text_filter: ["Text contains", "文本包含", "テキストを含む"], order: ["Order", "排序", "順序"],
  newest_first: ["newest first", "最新在前", "新しい順"], oldest_first: ["oldest first", "最早在前", "古い順"], apply: ["Apply", "应用", "適用"], clear: ["Clear", "清除", "クリア"],
  range: ["Range", "范围", "範囲"], entity: ["Entity", "对象", "対象"], importance: ["Importance", "重要度", "重要度"],
  importance_min: ["Importance ≥", "重要度 ≥", "重要度 ≥"], importance_max: ["Importance ≤", "重要度 ≤", "重要度 ≤"], absorbed: ["Absorbed", "已吸收", "吸収済み"],
  event_from: ["Event from", "事件起始", "出来事の開始"], event_to: ["Event to", "事件结束", "出来事の終了"], event_time: ["Event time", "事件时间", "出来事の時刻"],
  created: ["Stored", "存储时间", "保存日時"], any: ["any", "全部", "すべて"], yes: ["yes", "是", "はい"], no: ["no", "否", "いいえ"],
  ent_master: ["the user", "用户", "ユーザー"], ent_neko: ["the character", "角色", "キャラクター"], ent_relationship: ["relationship", "关系", "関係"],
  archived: ["archived", "已归档", "アーカイブ済み"], source_turns: ["Source turns", "来源对话", "元の会話"],
  active_facts: ["Active facts", "有效事实", "有効な事実"], archived_facts: ["Archived facts", "已归档事实", "アーカイブ済み事実"], rendered_in: ["Rendered in", "渲染耗时", "描画時間"],
  st_pending: ["Pending", "待定", "保留中"], st_confirmed: ["Confirmed", "已确认", "確認済み"], st_promoted: ["Promoted", "已晋升", "昇格済み"],
  st_denied: ["Denied", "已否认", "否定済み"], st_archived: ["Archived", "已归档", "アーカイブ済み"], st_merged: ["Merged", "已合并", "統合済み"],
  st_promote_blocked: ["Promotion blocked", "晋升受阻", "昇格ブロック"], st_: ["—", "—", "—"],
  confirm: ["Confirm", "确认", "確認"], deny: ["Deny", "否认", "否定"], evidence: ["Evidence", "证据", "根拠"], score: ["Score", "分数", "スコア"],
  feedback_sent: ["Feedback sent; status", "已发送反馈；状态", "フィードバック送信済み。状態"], status: ["Status", "状态", "状態"],
  net_score: ["net score", "净分", "正味スコア"], reinforcement: ["reinforcement", "强化", "強化"], disputation: ["disputation", "反驳", "反証"],
  history_since: ["journal kept since", "日志保留自", "ジャーナル保持開始"], events: ["Evidence changes", "证据变化", "根拠の変化"], event: ["Event", "事件", "イベント"],
  source_facts: ["Facts it came from", "来源事实", "元になった事実"], chart_title: ["Evidence over time", "证据随时间变化", "根拠の推移"],
  no_history: ["No journaled history.", "无日志历史。", "ジャーナルの履歴がありません。"],
  th_confirm: ["confirm", "确认线", "確認"], th_promote: ["promote", "晋升线", "昇格"], th_archive: ["archive", "归档线", "アーカイブ"],
  marks: ["Marks", "标记", "印"], protected: ["protected", "受保护", "保護"], suppressed: ["suppressed", "已抑制", "抑制中"], source: ["Source", "来源", "出典"],
  suppress: ["Suppress", "抑制", "抑制"], unsuppress: ["Unsuppress", "取消抑制", "抑制解除"],
  corrections_help: ["Contradictions between a persona entry and a newer reflection, waiting for the model's decision.", "人设条目与较新反思之间的矛盾，等待模型裁决。", "ペルソナ項目と新しいリフレクションの矛盾。モデルの判断待ち。"],
  old_text: ["Current text", "现有文本", "現在のテキスト"], new_text: ["Proposed text", "提议文本", "提案テキスト"], queued: ["Queued", "入队时间", "登録日時"], attempts: ["Attempts", "尝试次数", "試行回数"],
  query: ["Query", "查询", "クエリ"], time_box: ["Time", "时间", "時間"], time_placeholder: ["e.g. last week, 2026-11-03", "例如：上周、2026-11-03", "例：先週、2026-11-03"], search: ["Search", "搜索", "検索"],
  recall_help: ["Type a query, a time, or both: the lexical leg, the vector leg and the fused result appear side by side.", "输入查询、时间或两者：词法召回、向量召回与融合结果并排显示。", "クエリ・時間・その両方を入力すると、語彙検索・ベクトル検索・融合結果が並んで表示されます。"],
  indexed: ["Entries indexed", "已索引条目", "索引済みの項目"], in_window: ["Inside the time window", "时间窗口内", "時間枠内"], no_window: ["no window", "无窗口", "時間枠なし"],
  window: ["Time window", "时间窗口", "時間枠"], time_not_understood: ["time not understood (ignored)", "无法理解的时间（已忽略）", "時間を解釈できません（無視）"],
  time_hint: ["Time named in the query", "查询中提到的时间", "クエリ内の時間"], vector_leg: ["Vector leg", "向量召回", "ベクトル検索"], lexical_leg: ["Lexical leg (BM25)", "词法召回（BM25）", "語彙検索（BM25）"],
  fused: ["Fused result", "融合结果", "融合結果"], thresholds: ["Thresholds", "阈值", "しきい値"], budget: ["Budget", "预算", "予算"], elapsed: ["Time taken", "耗时", "所要時間"],
  tier: ["Tier", "层级", "層"], removed_by: ["Removed by", "被过滤原因", "除外理由"], ranks: ["Rank (lexical / vector)", "排名（词法 / 向量）", "順位（語彙 / ベクトル）"],
  tier_fact: ["fact", "事实", "事実"], tier_reflection: ["reflection", "反思", "リフレクション"], tier_fact_archive: ["archived fact", "已归档事实", "アーカイブ済み事実"],
  rm_time_window: ["time window", "时间窗口", "時間枠"], rm_below_threshold: ["below threshold", "低于阈值", "しきい値未満"], rm_over_budget: ["over budget", "超出预算", "予算超過"], rm_subject_scope: ["group memory (not this corpus)", "群组记忆（非本语料）", "グループの記憶（対象外）"],
  hard_filtered: ["Kept out by the hard filter", "被硬过滤排除", "ハードフィルタで除外"], reason: ["Reason", "原因", "理由"],
  context_help: ["The exact /new_dialog text the chat model gets:", "聊天模型收到的 /new_dialog 原文：", "チャットモデルが受け取る /new_dialog の全文："],
  tokens: ["tokens", "令牌", "トークン"], section: ["Section", "部分", "セクション"],
  sec_frame: ["Frame", "框架", "枠"], sec_persona: ["Persona", "人设", "ペルソナ"], sec_reflections: ["Reflections", "反思", "リフレクション"],
  sec_suppressed: ["Do not bring up", "不要主动提及", "自分から触れない"], sec_recent: ["Recent conversation", "近期对话", "最近の会話"],
  h_ok: ["The server is up (nekomem {version}).", "服务器运行中（nekomem {version}）。", "サーバーは稼働中です（nekomem {version}）。"],
  h_limited: ["The server is in limited mode: {reason}.", "服务器处于受限模式：{reason}。", "サーバーは制限モードです：{reason}。"],
  h_active: ["{n} characters are active in memory.", "内存中有 {n} 个活跃角色。", "メモリ上で {n} キャラクターが稼働中です。"],
  h_emb: ["Embeddings are {state} (model {model}, {pending} waiting).", "嵌入模型状态：{state}（模型 {model}，{pending} 个等待中）。", "埋め込みは{state}です（モデル {model}、待ち {pending} 件）。"],
  h_jobs: ["{n} model jobs are running.", "正在运行 {n} 个模型任务。", "{n} 件のモデルジョブが実行中です。"],
  emb_ready: ["ready", "就绪", "準備完了"], emb_loading: ["loading", "加载中", "読み込み中"], emb_disabled: ["disabled", "已停用", "無効"],
  model_tiers: ["Model tiers", "模型层级", "モデル階層"], configured: ["Configured", "已配置", "設定済み"], model: ["Model", "模型", "モデル"],
  calls: ["Calls", "调用", "呼び出し"], failures: ["Failures", "失败", "失敗"], last_error: ["Last error", "最近错误", "直近のエラー"],
  tier_state: ["State", "状态", "状態"], last_success: ["Last answer", "最近成功", "最後の応答"], failing_since: ["failing since", "出错自", "失敗開始"],
  recovered: ["recovered from", "已恢复，曾出错", "回復済み（以前のエラー）"],
  ts_ok: ["ok", "正常", "正常"], ts_failing: ["failing", "出错", "失敗中"], ts_untried: ["not used yet", "尚未使用", "未使用"], ts_unconfigured: ["not configured", "未配置", "未設定"],
  supervision: ["Supervision", "监管", "監視"], sup_child_restarts: ["actor restarts", "actor 重启次数", "アクター再起動"], sup_failed_children: ["failed actors", "失败的 actor", "失敗したアクター"], sup_handler_errors: ["handler errors (answered 500, layer reloaded)", "处理出错（已答 500，层已重新加载）", "ハンドラーのエラー（500 を返し、層を再読み込み）"],
  powerful_memory: ["Powerful memory", "强力记忆", "強力な記憶"], powerful_switch: ["Powerful memory on", "开启强力记忆", "強力な記憶をオン"],
  powerful_help: ["Batched fact extraction, evidence passes and automatic promotion. Turning it off resets the confirmation time of confirmed reflections.", "批量事实提取、证据评估与自动晋升。关闭时会重置已确认反思的确认时间。", "事実の一括抽出・根拠評価・自動昇格。オフにすると確認済みリフレクションの確認時刻がリセットされます。"],
};

const LANGS = ["en", "zh", "ja"];
let lang = "en";

export function browserLang() {
  for (const l of navigator.languages || [navigator.language || "en"]) {
    const base = String(l).toLowerCase().slice(0, 2);
    if (LANGS.includes(base)) return base;
  }
  return "en";
}

export function currentLang() { const saved = localStorage.getItem(LANG_KEY); return LANGS.includes(saved) ? saved : browserLang(); }

export function setLang(l) {
  lang = LANGS.includes(l) ? l : "en";
  localStorage.setItem(LANG_KEY, lang);
  document.documentElement.lang = lang === "zh" ? "zh-CN" : lang;
  applyStatic();
}

// The text of ``key`` in the current language ("" for an unknown key).
export function t(key) {
  const row = TEXT[key];
  return row ? row[LANGS.indexOf(lang)] || row[0] : "";
}

export function applyStatic() {
  for (const el of document.querySelectorAll("[data-i18n]")) el.textContent = t(el.getAttribute("data-i18n"));
}

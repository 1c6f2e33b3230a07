"""The localised strings of the /new_dialog text and /get_recent_history (zh, zh-TW, ja,
en, ko, ru, es, pt, the reference's languages).

Headers, the inner-thoughts sentence, the chat-gap notices and the elapsed-time forms follow
the reference's wording. The current-time stamp stays in the reference's English form
("Sunday, December 14, 2025 at 12:27 PM") in every language, as the reference sends it.
"""

from __future__ import annotations

LANGUAGES = ("zh", "zh-TW", "ja", "en", "ko", "ru", "es", "pt")

PERSONA_HEADER = {
    "zh": "\n======{name}的长期记忆======\n",
    "zh-TW": "\n======{name}的長期記憶======\n",
    "en": "\n======{name}'s Long-term Memory======\n",
    "ja": "\n======{name}の長期記憶======\n",
    "ko": "\n======{name}의 장기 기억======\n",
    "ru": "\n======Долговременная память {name}======\n",
    "es": "\n======Memoria a largo plazo de {name}======\n",
    "pt": "\n======Memória de longo prazo de {name}======\n",
}

INNER_THOUGHTS_HEADER = {
    "zh": "\n\n======以下是{name}的内心活动======\n",
    "zh-TW": "\n\n======以下是{name}的內心活動======\n",
    "en": "\n\n======{name}'s Inner Thoughts======\n",
    "ja": "\n\n======{name}の心の中======\n",
    "ko": "\n\n======{name}의 속마음======\n",
    "ru": "\n\n======Мысли {name}======\n",
    "es": "\n\n======Pensamientos de {name}======\n",
    "pt": "\n\n======Pensamentos de {name}======\n",
}

INNER_THOUGHTS_DYNAMIC = {
    "zh": "现在时间是{time}。开始聊天前，{name}又在脑海内整理了近期发生的事情。\n",
    "zh-TW": "現在時間是{time}。開始聊天前，{name}又在腦海裡整理了近期發生的事情。\n",
    "en": "The current time is {time}. Before the conversation begins, {name} is mentally reviewing recent events.\n",
    "ja": "現在の時刻は{time}です。会話を始める前に、{name}は最近の出来事を頭の中で整理しています。\n",
    "ko": "현재 시간은 {time}입니다. 대화를 시작하기 전에 {name}은 최근 일어난 일들을 머릿속으로 정리하고 있습니다.\n",
    "ru": "Текущее время: {time}. Перед началом разговора {name} мысленно перебирает недавние события.\n",
    "es": "La hora actual es {time}. Antes de empezar la conversación, {name} repasa mentalmente lo ocurrido últimamente.\n",
    "pt": "A hora atual é {time}. Antes de a conversa começar, {name} revisa mentalmente os acontecimentos recentes.\n",
}

CHAT_GAP_NOTICE = {
    "zh": "距离上次与{master}聊天已经过去了{elapsed}。",
    "zh-TW": "距離上次與{master}聊天已經過了{elapsed}。",
    "en": "It has been {elapsed} since the last conversation with {master}.",
    "ja": "{master}との最後の会話から{elapsed}が経過しました。",
    "ko": "{master}와의 마지막 대화로부터 {elapsed}이 지났습니다.",
    "ru": "С момента последнего разговора с {master} прошло {elapsed}.",
    "es": "Han pasado {elapsed} desde la última conversación con {master}.",
    "pt": "Já se passaram {elapsed} desde a última conversa com {master}.",
}

CHAT_GAP_LONG_HINT = {
    "zh": "{name}意识到已经很久没有和{master}说话了，这段时间里发生了什么呢？{name}很想知道{master}最近过得怎么样。",
    "zh-TW": "{name}意識到已經很久沒有和{master}說話了，這段時間裡發生了什麼呢？{name}很想知道{master}最近過得如何。",
    "en": "{name} realizes it has been quite a while since talking to {master}. What happened during this time? {name} is curious about how {master} has been.",
    "ja": "{name}は{master}と長い間話していなかったことに気づきました。この間に何があったのでしょう？{name}は{master}の最近の様子が気になっています。",
    "ko": "{name}은 {master}와 꽤 오랫동안 이야기하지 않았다는 것을 깨달았습니다. 그동안 무슨 일이 있었을까요? {name}은 {master}의 근황이 궁금합니다.",
    "ru": "{name} осознаёт, что давно не разговаривала с {master}. Что произошло за это время? {name} хочет узнать, как дела у {master}.",
    "es": "{name} nota que hace mucho que no habla con {master}. ¿Qué habrá pasado en este tiempo? {name} quiere saber cómo ha estado {master}.",
    "pt": "{name} percebe que faz bastante tempo que não conversa com {master}. O que aconteceu nesse período? {name} quer saber como {master} tem estado.",
}

CHAT_GAP_CURRENT_TIME = {
    "zh": "现在的时间是{now}。",
    "zh-TW": "現在的時間是{now}。",
    "en": "The current time is {now}.",
    "ja": "現在の時刻は{now}です。",
    "ko": "현재 시각은 {now}입니다.",
    "ru": "Сейчас {now}.",
    "es": "La hora actual es {now}.",
    "pt": "A hora atual é {now}.",
}

# Elapsed-time forms: only non-zero units (the reference's format_elapsed).
ELAPSED = {
    "dh": {
        "zh": "{d}天{h}小时",
        "zh-TW": "{d}天{h}小時",
        "en": "{d} days and {h} hours",
        "ja": "{d}日{h}時間",
        "ko": "{d}일 {h}시간",
        "ru": "{d} дн. {h} ч.",
        "es": "{d} días y {h} horas",
        "pt": "{d} dias e {h} horas",
    },
    "dm": {
        "zh": "{d}天{m}分钟",
        "zh-TW": "{d}天{m}分鐘",
        "en": "{d} days and {m} minutes",
        "ja": "{d}日{m}分",
        "ko": "{d}일 {m}분",
        "ru": "{d} дн. {m} мин.",
        "es": "{d} días y {m} minutos",
        "pt": "{d} dias e {m} minutos",
    },
    "d": {
        "zh": "{d}天",
        "zh-TW": "{d}天",
        "en": "{d} days",
        "ja": "{d}日",
        "ko": "{d}일",
        "ru": "{d} дн.",
        "es": "{d} días",
        "pt": "{d} dias",
    },
    "hm": {
        "zh": "{h}小时{m}分钟",
        "zh-TW": "{h}小時{m}分鐘",
        "en": "{h} hours and {m} minutes",
        "ja": "{h}時間{m}分",
        "ko": "{h}시간 {m}분",
        "ru": "{h} ч. {m} мин.",
        "es": "{h} horas y {m} minutos",
        "pt": "{h} horas e {m} minutos",
    },
    "h": {
        "zh": "{h}小时",
        "zh-TW": "{h}小時",
        "en": "{h} hours",
        "ja": "{h}時間",
        "ko": "{h}시간",
        "ru": "{h} ч.",
        "es": "{h} horas",
        "pt": "{h} horas",
    },
    "m": {
        "zh": "{m}分钟",
        "zh-TW": "{m}分鐘",
        "en": "{m} minutes",
        "ja": "{m}分",
        "ko": "{m}분",
        "ru": "{m} мин.",
        "es": "{m} minutos",
        "pt": "{m} minutos",
    },
}

RECENT_HISTORY_INTRO = {
    "zh": "{master}与{name}最近的对话：\n",
    "zh-TW": "{master}與{name}最近的對話：\n",
    "en": "Recent conversation between {master} and {name}:\n",
    "ja": "{master}と{name}の最近の会話：\n",
    "ko": "{master}와 {name}의 최근 대화:\n",
    "ru": "Недавний разговор {master} и {name}:\n",
    "es": "Conversación reciente entre {master} y {name}:\n",
    "pt": "Conversa recente entre {master} e {name}:\n",
}

NO_RECENT_HISTORY = {
    "zh": "暂无与{name}的最近对话。",
    "zh-TW": "暫無與{name}的最近對話。",
    "en": "No recent conversation with {name}.",
    "ja": "{name}との最近の会話はありません。",
    "ko": "{name}와의 최근 대화가 없습니다.",
    "ru": "Недавних разговоров с {name} нет.",
    "es": "No hay conversaciones recientes con {name}.",
    "pt": "Não há conversas recentes com {name}.",
}


def normalise_language(raw: object, default: str = "en") -> str:
    """One of :data:`LANGUAGES` for a request's language ("zh-CN", "ja_JP", "zh-Hant",
    "EN" ...); ``default`` when it names none of them."""
    if not isinstance(raw, str) or not raw.strip():
        return default if default in LANGUAGES else "en"
    code = raw.strip().replace("_", "-").lower()
    if code in ("zh-tw", "zh-hk", "zh-mo", "zh-hant") or code.startswith("zh-hant"):
        return "zh-TW"
    base = code.split("-", 1)[0]
    if base in LANGUAGES:
        return base
    return default if default in LANGUAGES else "en"


def text(table: dict[str, str], language: str, **values: object) -> str:
    """``table``'s string for ``language`` (English when missing), formatted."""
    return table.get(language, table["en"]).format(**values)


def format_elapsed(seconds: float, language: str) -> str:
    """ "3 hours and 22 minutes" / "3小时22分钟" ...: days, hours, minutes, zeros left out."""
    total = int(max(0.0, seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        key = "dh" if hours else "dm" if minutes else "d"
    elif hours:
        key = "hm" if minutes else "h"
    else:
        key = "m"
    return text(ELAPSED[key], language, d=days, h=hours, m=minutes)

"""Recall tokenizer: CJK n-grams, Latin words, Hangul, stop names, odd input."""

from __future__ import annotations

from collections import Counter

from nekomem.config.recall import RecallSettings
from nekomem.recall.tokenize import Tokenizer, fold_english, tokenize

UNSPLIT = Tokenizer(RecallSettings(recall_cjk_split_scripts=False))


def test_cjk_run_gives_sliding_two_and_three_grams_with_repeats_kept() -> None:
    assert tokenize("我喜欢猫") == ["我喜", "喜欢", "欢猫", "我喜欢", "喜欢猫"]
    assert UNSPLIT("猫が好き") == ["猫が", "が好", "好き", "猫が好", "が好き"]
    assert Counter(tokenize("猫猫猫")) == Counter({"猫猫": 2, "猫猫猫": 1})


def test_single_characters_only_for_runs_of_length_one() -> None:
    assert tokenize("猫") == ["猫"]
    assert tokenize("猫、犬。鳥") == ["猫", "犬", "鳥"]
    assert "猫" not in tokenize("我喜欢猫咪")


def test_japanese_runs_are_cut_where_kanji_hiragana_and_katakana_meet() -> None:
    assert tokenize("猫が好き") == ["猫", "が", "好", "き"]
    assert tokenize("昨日ラーメンを食べた") == ["昨日", "ラー", "ーメ", "メン", "ラーメ", "ーメン", "を", "食", "べた"]
    # No n-gram straddles a word and its particle or okurigana ...
    assert not {"を焼", "焼い", "ンを"} & set(tokenize("パンを焼いている"))
    # ... so the same verb meets across its inflections, and a noun across its particles.
    assert "焼" in set(tokenize("パンを焼いている")) & set(tokenize("カンパーニュを焼いたら膨らんだ"))
    assert {"ラー", "メン", "ーメン"} <= set(tokenize("ラーメンが好き")) & set(tokenize("味噌ラーメンは最高"))


def test_straddling_ngrams_are_the_parts_of_runs_the_split_could_not_cut() -> None:
    tokenizer = Tokenizer()
    # Chinese: every n-gram shorter than its run may straddle two words; a whole run is a word.
    assert tokenizer.straddling("我喜欢猫") == {"我喜", "喜欢", "欢猫", "我喜欢", "喜欢猫"}
    assert tokenizer.straddling("拉面，咖啡") == set()
    # Japanese cut at script changes: the pieces are word-like, nothing straddles ...
    assert tokenizer.straddling("昨日ラーメンを食べた") == set()
    # ... except inside a run that has a single script, and everywhere when the split is off.
    assert tokenizer.straddling("変形性膝関節症") >= {"変形", "形性", "関節症"}
    assert tokenizer.straddling("猫が好き") == set()
    assert UNSPLIT.straddling("猫が好き") == {"猫が", "が好", "好き", "猫が好", "が好き"}
    # Only tokens are ever reported, and none of the Latin or Hangul words.
    text = "我喜欢猫 and 라면을 먹었다, 味噌ラーメン"
    assert tokenizer.straddling(text) <= set(tokenizer(text))


def test_script_split_keeps_marks_inside_their_piece_and_leaves_chinese_alone() -> None:
    assert tokenize("時々雨") == ["時々", "々雨", "時々雨"]  # the iteration mark belongs to the ideographs
    assert tokenize("コーヒー") == UNSPLIT("コーヒー")  # the prolonged sound mark belongs to katakana
    chinese = "我曾经在五月二日去过博物馆，看了古代丝绸的展览"
    assert tokenize(chinese) == UNSPLIT(chinese)


def test_japanese_without_spaces_is_searchable_by_a_word() -> None:
    doc = set(tokenize("昨日ラーメンを食べた"))
    query = tokenize("ラーメン")
    assert query == ["ラー", "ーメ", "メン", "ラーメ", "ーメン"]
    assert set(query) <= doc


def test_chinese_without_spaces_is_searchable_by_a_word() -> None:
    assert set(tokenize("拉面")) <= set(tokenize("主人昨天晚上吃了一碗拉面"))
    assert not set(tokenize("咖啡")) & set(tokenize("主人昨天晚上吃了一碗拉面"))


def test_halfwidth_katakana_and_fullwidth_latin_are_normalised() -> None:
    assert tokenize("ﾗｰﾒﾝ") == tokenize("ラーメン")
    assert tokenize("Ｒａｍｅｎ　２０２６") == ["ramen", "2026"]


def test_latin_words_lowercased_short_ones_dropped_numbers_kept() -> None:
    assert tokenize("I have a Cat, 3 dogs and an MP3") == ["have", "cat", "3", "dog", "and", "an", "mp3"]


def test_mixed_scripts_split_at_script_boundaries() -> None:
    assert tokenize("iPhone买了") == ["iphone", "买了"]
    assert tokenize("Привет, мир") == ["привет", "мир"]


def test_hangul_words_are_whole_tokens() -> None:
    assert tokenize("라면을 먹었다") == ["라면을", "먹었다"]


def test_english_suffix_folding() -> None:
    assert [fold_english(w) for w in ("cats", "stories", "boxes", "classes", "dishes", "likes")] == [
        "cat",
        "story",
        "box",
        "class",
        "dish",
        "like",
    ]
    assert [fold_english(w) for w in ("glass", "virus", "analysis", "bus", "this", "ramen")] == [
        "glass",
        "virus",
        "analysis",
        "bus",
        "this",
        "ramen",
    ]
    assert tokenize("the cat's toys") == tokenize("the cat toy")
    plain = Tokenizer(RecallSettings(recall_fold_english_suffixes=False))
    assert plain("cats") == ["cats"]


def test_stop_names_are_removed_latin_by_word_cjk_by_substring() -> None:
    names = ["Neko", "小白", "x"]
    assert tokenize("小白说Neko喜欢annual Neko的猫", names) == ["说", "喜欢", "annual", "的猫"]
    assert tokenize("NEKO likes Nekomimi", ["neko"]) == ["like", "nekomimi"]
    # A one-character name is below recall_stop_name_min_chars and stays.
    assert tokenize("猫", ["猫"]) == ["猫"]
    one = Tokenizer(RecallSettings(recall_stop_name_min_chars=1))
    assert one("猫", ["猫"]) == []


def test_stop_names_are_normalised_like_the_text() -> None:
    assert tokenize("Ｎｅｋｏ loves tea", ["neko"]) == ["love", "tea"]
    assert tokenize("ﾈｺが好き", ["ネコ"]) == tokenize("が好き")


def test_odd_input_never_raises() -> None:
    assert tokenize(None) == []  # type: ignore[arg-type]
    assert tokenize(42) == ["42"]  # type: ignore[arg-type]
    assert tokenize(["tea", "cake"]) == ["tea", "cake"]  # type: ignore[arg-type]
    assert tokenize("") == []
    assert tokenize("  \n\t ,.!") == []


def test_ngram_sizes_follow_the_settings() -> None:
    bigrams = Tokenizer(RecallSettings(recall_cjk_ngram_min=2, recall_cjk_ngram_max=2))
    assert bigrams("我喜欢猫") == ["我喜", "喜欢", "欢猫"]
    unigrams = Tokenizer(RecallSettings(recall_cjk_ngram_min=1, recall_cjk_ngram_max=1))
    assert unigrams("猫が") == ["猫", "が"]


def test_ascii_text_gives_the_tokens_of_the_general_path() -> None:
    # The ASCII fast path must cut exactly as the general one (which a CJK character forces).
    texts = ["Master's 3 cats played at 10:30 in Osaka!", "a bb ccc dddd classes stories boxes", "x_y 42 1st ÿ", "e-mail re-do  tabs\there"]
    tokenizer = Tokenizer()
    for text in texts:
        assert tokenizer(text + " 日") == [*tokenizer(text), "日"]


def test_the_memoised_words_are_dropped_when_entries_leave_an_index():
    from nekomem.recall.query_text import forget_memoised_words, light_stem
    from nekomem.recall.tokenize import fold_english

    fold_english("kites")
    light_stem("walking")
    assert fold_english.cache_info().currsize > 0 and light_stem.cache_info().currsize > 0
    forget_memoised_words()
    assert fold_english.cache_info().currsize == 0 and light_stem.cache_info().currsize == 0

"""Hand-made documents for the curation tests: one that every filter keeps, and one per rule that
trips that rule."""

from __future__ import annotations

SENTENCES = [
    "The river runs past the old mill and turns toward the quiet valley below.",
    "Farmers in the region have grown wheat and barley there for many generations.",
    "Each spring the water rises, and the families move their animals to higher fields.",
    "A small school stands near the bridge, with a garden that the children look after.",
    "Visitors often stop to photograph the stone arches that carry the road over the stream.",
    "In the evening the light falls across the hills and the bells of the chapel ring.",
    "Local historians say that the mill was built with timber from the northern forest.",
    "The market opens on Saturdays, when traders sell bread, cheese and honey to walkers.",
    "Most of the houses have thick walls that keep them cool during the long summers.",
    "A path along the bank leads to a lake where herons wait among the tall reeds.",
]
GOOD = "\n".join(SENTENCES)

GERMAN = ("Der Fluss fließt an der alten Mühle vorbei und biegt in das stille Tal ab. Die Bauern der Gegend "
          "bauen dort seit vielen Generationen Weizen und Gerste an. Jeden Frühling steigt das Wasser.")
FRENCH = ("La rivière passe devant le vieux moulin et tourne vers la vallée tranquille. Les agriculteurs de la "
          "région y cultivent du blé et de l'orge depuis de nombreuses générations.")


LONG_WORDS = ("Incomprehensibilities Counterrevolutionaries Uncharacteristically Electroencephalographs "
              "Internationalizations Misunderstandingly Disproportionately Institutionalization "
              "Compartmentalization Telecommunications Interdisciplinary Overgeneralization").split()
NO_GRAMS = {"top_n_grams": "", "dup_n_grams": ""}


# filter -> [(rule, document, options that make the document trip that rule, options that turn it off)]
CASES = {
    "gopher-quality": [
        ("short_doc", "\n".join(SENTENCES[:3]), {}, {"min_doc_words": None}),
        ("long_doc", GOOD, {"max_doc_words": 100}, {"max_doc_words": None}),
        ("short_words", "\n".join(f"We go to the car {i} and we do it at six so it is ok by me." for i in range(6)),
         {}, {"min_avg_word_length": None}),
        ("long_words", " ".join(["Internationalization of telecommunications infrastructure and the "
                                 "characterization of electromagnetic interoperability requirements."] * 6),
         {}, {"max_avg_word_length": None}),
        ("hashes", GOOD + " " + " ".join(["#tag"] * 30), {}, {"max_symbol_word_ratio": None}),
        ("ellipses", GOOD + " " + " ".join(["wait…"] * 30), {}, {"max_symbol_word_ratio": None}),
        ("bullet_lines", "\n".join("- " + s for s in SENTENCES), {}, {"max_bullet_lines_ratio": None}),
        ("ellipsis_lines", "\n".join(s[:-1] + "..." if i % 2 else s for i, s in enumerate(SENTENCES)), {},
         {"max_ellipsis_lines_ratio": None}),
        ("alpha_words", GOOD + "\n" + " ".join(str(1000 + i) for i in range(60)), {},
         {"min_alpha_words_ratio": None}),
        ("stop_words", "\n".join(s.replace("the ", "a ").replace("The ", "A ").replace(" and ", " or ")
                                 .replace(" to ", " toward ").replace(" of ", " from ").replace(" that ", " which ")
                                 .replace(" have ", " had ").replace(" with ", " by ") for s in SENTENCES),
         {}, {"min_stop_words": None}),
    ],
    "gopher-repetition": [
        ("empty", "", {}, None),
        ("dup_para_frac", GOOD + "\n\nNote.\n\nNote.\n\nNote.\n\nNote.", {}, {"dup_para_frac": None}),
        ("dup_para_char_frac", "\n\n".join(["\n".join(SENTENCES[i:i + 2]) for i in range(0, 10, 2)]
                                            + [SENTENCES[0] * 5] * 2),
         {"dup_line_frac": None, "dup_line_char_frac": None, **NO_GRAMS}, {"dup_para_char_frac": None}),
        ("dup_line_frac", "\n".join(SENTENCES + ["Ok."] * 6), {}, {"dup_line_frac": None}),
        ("dup_line_char_frac", "\n".join(SENTENCES + [SENTENCES[0] * 2] * 3), NO_GRAMS,
         {"dup_line_char_frac": None}),
        ("top_2_gram", "\n".join(f"New York {w}." for w in "is big old far cold warm loud busy home".split()),
         {"dup_line_frac": None}, {"top_n_grams": ""}),
        ("dup_5_gram", GOOD + " " + " ".join(SENTENCES[:4]), {"top_n_grams": ""}, NO_GRAMS),
    ],
    "c4": [
        ("lorem_ipsum", GOOD + "\nLorem ipsum dolor sit amet, consectetur adipiscing.", {},
         {"filter_lorem_ipsum": False}),
        ("curly_bracket", GOOD + "\nThe function returns {value} to the caller.", {},
         {"filter_curly_bracket": False}),
        ("too_few_sentences", "\n".join(SENTENCES[:3]), {}, {"min_num_sentences": -1}),
    ],
    "fineweb": [
        ("empty", "\n\n", {}, None),
        ("line_punct_ratio", "\n".join(s[:-1] for s in SENTENCES), {}, {"line_punct_thr": 0.0}),
        ("short_line_ratio", "\n".join(s.split(",")[0][:28] + "." for s in SENTENCES), {},
         {"short_line_thr": 1.0}),
        ("char_dup_ratio", GOOD + "\n" + SENTENCES[0], {}, {"char_duplicates_ratio": 1.0}),
        ("list_ratio", "\n".join(f"{w} notwithstanding." for w in LONG_WORDS), {}, {"new_line_ratio": 10.0}),
    ],
}

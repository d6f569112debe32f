//! `random:N`: prompts of N random common words. Common English words are one token each in
//! most BPE vocabularies, so N words come close to N input tokens without a tokenizer.

use super::Prompt;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "year",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "name",
    "team",
    "minute",
    "idea",
    "kid",
    "body",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "good",
    "new",
    "first",
    "last",
    "long",
    "great",
    "little",
    "own",
    "other",
    "old",
    "big",
    "high",
    "different",
    "small",
    "large",
    "next",
    "early",
    "young",
    "important",
    "few",
    "public",
    "bad",
    "same",
    "able",
    "make",
    "know",
    "take",
    "see",
    "come",
    "think",
    "look",
    "want",
    "give",
    "use",
    "find",
    "tell",
    "ask",
    "seem",
    "feel",
    "try",
    "leave",
    "call",
    "keep",
    "let",
    "begin",
    "show",
];

pub fn prompts(input_tokens: usize, count: usize, seed: u64) -> Vec<Prompt> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x0a4d_0a4d);
    (0..count)
        .map(|_| {
            let text = words(&mut rng, input_tokens);
            // A different opening per prompt keeps a prefix cache from sharing whole prompts.
            let n: u32 = rng.random_range(0..1_000_000);
            Prompt::Text(format!("{n} {text}"))
        })
        .collect()
}

/// `n` random common words separated by spaces.
pub(super) fn words(rng: &mut StdRng, n: usize) -> String {
    let mut text = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(WORDS.choose(rng).expect("word list is not empty"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_count_matches_request() {
        let p = prompts(100, 3, 1);
        for prompt in &p {
            let Prompt::Text(t) = prompt else {
                unreachable!()
            };
            assert_eq!(t.split(' ').count(), 101);
        }
        assert_ne!(p[0], p[1]);
    }
}

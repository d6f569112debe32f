//! `shared-prefix:PREFIX_TOKENS:GROUPS` (like SGLang's `generated-shared-prefix`): `GROUPS`
//! system prompts of about `PREFIX_TOKENS` random words each, every request one of them followed
//! by its own short question, the groups taking turns. A server with a prefix cache computes
//! each system prompt once; one without computes it for every request.

use super::Prompt;
use super::random::words;
use protocol::ChatMessage;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Words of each request's own question.
const QUESTION_WORDS: usize = 24;

pub fn prompts(prefix_tokens: usize, groups: usize, count: usize, seed: u64) -> Vec<Prompt> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5a5a_0001);
    let systems: Vec<String> = (0..groups)
        .map(|g| format!("Group {g}. {}", words(&mut rng, prefix_tokens)))
        .collect();
    (0..count.max(2 * groups))
        .map(|i| {
            let question = format!(
                "Question {i}: summarise the text above in one sentence, then {}",
                words(&mut rng, QUESTION_WORDS)
            );
            Prompt::Messages(vec![
                ChatMessage::system(systems[i % groups].clone()),
                ChatMessage::user(question),
            ])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_shares_its_system_prompt_and_questions_differ() {
        let p = prompts(100, 3, 10, 1);
        assert_eq!(p.len(), 10);
        let system = |i: usize| p[i].messages()[0].text();
        assert_eq!(system(0), system(3));
        assert_ne!(system(0), system(1));
        assert!(system(0).split(' ').count() >= 100);
        assert_ne!(p[0].messages()[1].text(), p[3].messages()[1].text());
        // At least two requests a group, however few are asked for.
        assert_eq!(prompts(10, 4, 1, 1).len(), 8);
    }
}

//! The built-in `edit` dataset: two-turn code editing. In turn one the user asked for a piece of
//! code and the assistant answered with it; turn two asks for a revision (rename, add a check,
//! reformat, document, change a detail) and the whole code back. Most of the answer repeats the
//! assistant's own earlier answer: the multi-turn editing workload of coding assistants, where
//! drafts from the context (prompt lookup, suffix decoding) should pay most.

use super::Prompt;
use super::rewrite::{CODE_PASSAGES, PASSAGES};
use protocol::ChatMessage;

/// Per code passage (in `PASSAGES` order): turn one's request, the fence's language, and the
/// revisions turn two asks for.
const TASKS: [(&str, &str, [&str; 5]); CODE_PASSAGES] = [
    (
        "Write a Python function `total_price(items, tax_rate, discount=None)` that returns the \
         price of an order with tax, supporting percent and fixed discounts.",
        "python",
        [
            "Rename `subtotal` to `net_amount` everywhere. Give me the whole function again.",
            "Add a check at the start that raises ValueError when `tax_rate` is negative. Reply \
             with the full updated function.",
            "Add type hints to the signature and keep everything else the same. Show the \
             complete function.",
            "Round to 2 decimals only at the very end, but also clamp the tax at zero. Show the \
             complete function.",
            "Reformat the function with 2-space indentation instead of 4. Give me all of it.",
        ],
    ),
    (
        "Write Rust functions that parse a port number and a `HOST:PORT` address, with a test.",
        "rust",
        [
            "Rename `parse_address` to `parse_host_port`. Give me the whole file again.",
            "Make `parse_address` also reject a host that contains a space. Show the complete \
             updated code.",
            "Add a `///` doc comment above each function. Reply with the full code.",
            "Add a second test, `parses_addresses`, for `parse_address`. Show the whole file.",
            "Change the error type from `String` to `&'static str` where possible, and give me \
             the full code.",
        ],
    ),
    (
        "Write `debounce` and `throttle` helpers in plain JavaScript, and use debounce for a \
         search box.",
        "javascript",
        [
            "Rename the parameter `fn` to `callback` in both helpers. Give me the full code \
             again.",
            "Make `debounce` throw a TypeError when `fn` is not a function. Show the complete \
             updated code.",
            "Convert the two helpers to arrow functions assigned to `const`, keeping the \
             behaviour. Reply with the full code.",
            "Add a JSDoc comment above each helper. Show all of the code.",
            "Change the search delay from 300 to 250 milliseconds and log the query before the \
             fetch. Give me the full code.",
        ],
    ),
    (
        "Write a Stack class and a Queue class in Python.",
        "python",
        [
            "Rename `items` to `elements` in both classes. Show me the whole code again.",
            "Add a `peek` method to Queue that raises IndexError on an empty queue. Give me the \
             complete code.",
            "Add a docstring to every method. Reply with the full code.",
            "Add an `is_empty` method to Queue and use it in `dequeue`. Show all of it.",
            "Add type hints to every method. Give me both classes in full.",
        ],
    ),
    (
        "Write SQL queries for our top customers and our best-selling products since 2024.",
        "sql",
        [
            "Rename the aliases `order_count` to `orders_placed` and `total_spent` to `spent`. \
             Show both queries in full again.",
            "Change the date filter to 2025-01-01 in both queries. Give me both in full.",
            "Write all the SQL keywords in lower case. Show both queries in full.",
            "Also keep only paid orders in the second query. Give me both queries again.",
            "Add a comment line above each query saying what it returns. Show both in full.",
        ],
    ),
    (
        "Write a shell script that archives the logs in /var/log/app and removes archives \
         older than thirty days.",
        "sh",
        [
            "Rename `log_dir` to `logs` and `archive_dir` to `archives`. Give me the whole \
             script again.",
            "Add a check that exits with an error message when the log folder does not exist. \
             Show the complete script.",
            "Add a comment above each step of the script. Reply with the full script.",
            "Keep archives for sixty days instead of thirty. Give me the whole script.",
            "Use `xz` instead of `gzip`. Show the complete script.",
        ],
    ),
];

pub fn prompts() -> Vec<Prompt> {
    TASKS
        .iter()
        .zip(PASSAGES)
        .flat_map(|((request, language, revisions), code)| {
            revisions.iter().map(move |revision| {
                Prompt::Messages(vec![
                    ChatMessage::user(*request),
                    ChatMessage::new(
                        "assistant",
                        format!("Here it is:\n\n```{language}\n{code}```"),
                    ),
                    ChatMessage::user(*revision),
                ])
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_prompt_revises_code_the_assistant_wrote_in_turn_one() {
        let prompts = prompts();
        assert_eq!(
            prompts.len(),
            30,
            "enough for a level of 30 without repeats"
        );
        for prompt in &prompts {
            let messages = prompt.messages();
            let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
            assert_eq!(roles, ["user", "assistant", "user"]);
            assert!(messages[1].text().contains("```"));
            assert_eq!(
                prompt.text(),
                messages[2].text(),
                "completions send turn two"
            );
        }
        // The Rust answer is the Rust passage, the shell one the script.
        let text = |i: usize| prompts[i].messages()[1].text();
        assert!(text(5).contains("fn parse_port"));
        assert!(text(25).contains("#!/bin/sh"));
    }
}

//! What a client's spec may ask of the compiler: explicit limits on its size and shape, checked
//! by iterative code before llguidance sees it (so no spec can take the compiler's recursion
//! past its stack, or its time and memory past what the box has), and the llguidance limits
//! that bound each compilation and each mask. Every value was measured against SmolLM2's
//! 49k-token vocabulary on a 2-core machine (see `examples/grammar_probe.rs`).

use crate::lark::scan_lark;
use crate::scan::{Totals, scan_regex, scan_schema};
use crate::spec::GrammarSpec;
use crate::{GrammarError, StructuralTag};
use llguidance::api::ParserLimits;

/// Bytes of all the JSON schemas of one spec, serialized (OpenAI's strict mode allows 120,000
/// characters of property names and 15,000 of enum values; descriptions come on top).
pub const MAX_SCHEMA_BYTES: usize = 1 << 20;
/// Levels of JSON objects and arrays a schema nests, its `$ref`s followed, each `$ref` a level
/// too (a chain of definitions is as deep as the schema written out; recursion is not depth).
/// A schema 10 levels deep, OpenAI's limit, is about 40: each level is `properties`, the
/// property, and often `anyOf` and its list. llguidance compiles by recursion, 1-15 kB of stack
/// a level (a chain of 1,000 nested definitions needed 8-16 MiB).
pub const MAX_SCHEMA_DEPTH: usize = 128;
/// Properties of one object (`properties` and `patternProperties`): llguidance puts about four
/// parser items per optional property in a row, under [`MAX_ITEMS_IN_ROW`]; masks slow down
/// with it (8 ms the slowest at 1,000).
pub const MAX_OBJECT_PROPERTIES: usize = 1_000;
/// Properties one position chooses among, the alternatives of an `anyOf`, `oneOf` or `allOf`
/// added up, each counting 4 more (an estimate from above: see `width.rs`). Masks slow down
/// with it, worst with many alternatives that allow any other key: at the limit the slowest
/// mask took 55 ms, past it over a second.
pub const MAX_SCHEMA_WIDTH: usize = 1_000;
/// Properties of all the objects of a spec's schemas (OpenAI's: 5,000).
pub const MAX_TOTAL_PROPERTIES: usize = 5_000;
/// Bytes of all property names (OpenAI's: 120,000 characters).
pub const MAX_PROPERTY_NAME_BYTES: usize = 120_000;
/// Entries of `$defs` and `definitions`, all of a spec's schemas together.
pub const MAX_DEFINITIONS: usize = 1_000;
/// `$ref`s, all of a spec's schemas together: each can nest the grammar one level deeper.
pub const MAX_REFS: usize = 2_000;
/// Values of one `enum` (OpenAI's: 1,000).
pub const MAX_ENUM_VALUES: usize = 1_000;
/// `enum` values and `const`s, all of a spec's schemas together.
pub const MAX_TOTAL_ENUM_VALUES: usize = 10_000;
/// Alternatives of one `anyOf`, `oneOf` or `allOf` (and items of one `prefixItems`); the
/// width limit allows 250 at most anyway.
pub const MAX_ALTERNATIVES: usize = 250;
/// Bytes of one `pattern` (or `patternProperties` key) in a schema.
pub const MAX_PATTERN_BYTES: usize = 4_096;
/// Size of a regex (a `regex`, a `pattern`, a grammar's `/.../`) or a grammar's rule with its
/// counted repetitions written out (`a{100}` is 100, nested ones multiply, alternatives add, a
/// grammar's terminals are inlined; as much as [`MAX_REGEX_BYTES`], so a regex within those
/// bytes passes unless it repeats): masks slow down with it, and nested repetitions of a few
/// bytes can exhaust the compiler (see `expand.rs`).
pub const MAX_REPETITION_EXPANSION: usize = 16_384;
/// Bytes of a `regex`.
pub const MAX_REGEX_BYTES: usize = 16_384;
/// Bytes of an `ebnf` grammar (GBNF or Lark), its `%json` schemas included.
pub const MAX_GRAMMAR_BYTES: usize = 256 << 10;
/// Levels of groups nested in a grammar (`(`, `[`, `{`) or a regex (`(`): llguidance compiles
/// both by recursion, a chain of rules as deep as the rules times their nesting (2-4 kB of
/// stack for each: 2,000 rules 10 levels deep took 32-64 MiB).
pub const MAX_GRAMMAR_DEPTH: usize = 16;
/// Rules of a grammar (a chain of 1,000, each 16 levels deep, is within 64 MiB of stack).
pub const MAX_GRAMMAR_RULES: usize = 1_000;
/// Alternatives (`|`) of a grammar, all its rules together: every one can be a parser item.
pub const MAX_GRAMMAR_ALTERNATIVES: usize = 5_000;
/// Structures of a `structural_tag`.
pub const MAX_STRUCTURES: usize = 128;
/// Triggers of a `structural_tag` (each is taken out of the free text's lexeme).
pub const MAX_TRIGGERS: usize = 32;
/// Bytes of one trigger, `begin` or `end` of a `structural_tag`.
pub const MAX_TAG_BYTES: usize = 256;
/// Functions a tool-call grammar holds (OpenAI's limit on `tools`: 128).
pub const MAX_TOOLS: usize = 128;
/// llguidance's items in one row of its Earley parser: over twice what the widest schema
/// allowed makes (about 4 a property, some 4,000) and the most alternatives of a grammar
/// (5,001). The default, 2,000, fails mid-generation on 500 optional properties, after the
/// first mask has passed.
pub const MAX_ITEMS_IN_ROW: usize = 10_000;
/// llguidance's items created while computing one mask (its default: 50,000, at about 20k a
/// millisecond; doubled with the rows [`MAX_ITEMS_IN_ROW`] allows).
pub const STEP_MAX_ITEMS: usize = 100_000;
/// llguidance's fuel for building the lexer at compile time (its default, at about 50k a
/// millisecond).
pub const INITIAL_LEXER_FUEL: u64 = 1_000_000;
/// llguidance's lexer fuel for one mask (its default, at about 14k a millisecond).
pub const STEP_LEXER_FUEL: u64 = 200_000;
/// llguidance's lexer states of one grammar, made as sequences use it and kept for its life,
/// 1-2 kB each (its default: 250,000, up to 500 MB for one grammar in the cache).
pub const MAX_LEXER_STATES: usize = 100_000;
/// llguidance's grammar size (symbols in productions; its default: 500,000).
pub const MAX_GRAMMAR_SIZE: usize = 500_000;

/// The limits a spec is held to; [`Default`] gives the constants of this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrammarLimits {
    /// [`MAX_SCHEMA_BYTES`].
    pub max_schema_bytes: usize,
    /// [`MAX_SCHEMA_DEPTH`].
    pub max_schema_depth: usize,
    /// [`MAX_OBJECT_PROPERTIES`].
    pub max_object_properties: usize,
    /// [`MAX_SCHEMA_WIDTH`].
    pub max_schema_width: usize,
    /// [`MAX_TOTAL_PROPERTIES`].
    pub max_total_properties: usize,
    /// [`MAX_PROPERTY_NAME_BYTES`].
    pub max_property_name_bytes: usize,
    /// [`MAX_DEFINITIONS`].
    pub max_definitions: usize,
    /// [`MAX_REFS`].
    pub max_refs: usize,
    /// [`MAX_ENUM_VALUES`].
    pub max_enum_values: usize,
    /// [`MAX_TOTAL_ENUM_VALUES`].
    pub max_total_enum_values: usize,
    /// [`MAX_ALTERNATIVES`].
    pub max_alternatives: usize,
    /// [`MAX_PATTERN_BYTES`].
    pub max_pattern_bytes: usize,
    /// [`MAX_REGEX_BYTES`].
    pub max_regex_bytes: usize,
    /// [`MAX_REPETITION_EXPANSION`].
    pub max_repetition_expansion: usize,
    /// [`MAX_GRAMMAR_BYTES`].
    pub max_grammar_bytes: usize,
    /// [`MAX_GRAMMAR_DEPTH`].
    pub max_grammar_depth: usize,
    /// [`MAX_GRAMMAR_RULES`].
    pub max_grammar_rules: usize,
    /// [`MAX_GRAMMAR_ALTERNATIVES`].
    pub max_grammar_alternatives: usize,
    /// [`MAX_STRUCTURES`].
    pub max_structures: usize,
    /// [`MAX_TRIGGERS`].
    pub max_triggers: usize,
    /// [`MAX_TAG_BYTES`].
    pub max_tag_bytes: usize,
    /// [`MAX_TOOLS`].
    pub max_tools: usize,
    /// [`MAX_ITEMS_IN_ROW`].
    pub max_items_in_row: usize,
    /// [`STEP_MAX_ITEMS`].
    pub step_max_items: usize,
    /// [`INITIAL_LEXER_FUEL`].
    pub initial_lexer_fuel: u64,
    /// [`STEP_LEXER_FUEL`].
    pub step_lexer_fuel: u64,
    /// [`MAX_LEXER_STATES`].
    pub max_lexer_states: usize,
    /// [`MAX_GRAMMAR_SIZE`].
    pub max_grammar_size: usize,
}

impl Default for GrammarLimits {
    fn default() -> Self {
        Self {
            max_schema_bytes: MAX_SCHEMA_BYTES,
            max_schema_depth: MAX_SCHEMA_DEPTH,
            max_object_properties: MAX_OBJECT_PROPERTIES,
            max_schema_width: MAX_SCHEMA_WIDTH,
            max_total_properties: MAX_TOTAL_PROPERTIES,
            max_property_name_bytes: MAX_PROPERTY_NAME_BYTES,
            max_definitions: MAX_DEFINITIONS,
            max_refs: MAX_REFS,
            max_enum_values: MAX_ENUM_VALUES,
            max_total_enum_values: MAX_TOTAL_ENUM_VALUES,
            max_alternatives: MAX_ALTERNATIVES,
            max_pattern_bytes: MAX_PATTERN_BYTES,
            max_regex_bytes: MAX_REGEX_BYTES,
            max_repetition_expansion: MAX_REPETITION_EXPANSION,
            max_grammar_bytes: MAX_GRAMMAR_BYTES,
            max_grammar_depth: MAX_GRAMMAR_DEPTH,
            max_grammar_rules: MAX_GRAMMAR_RULES,
            max_grammar_alternatives: MAX_GRAMMAR_ALTERNATIVES,
            max_structures: MAX_STRUCTURES,
            max_triggers: MAX_TRIGGERS,
            max_tag_bytes: MAX_TAG_BYTES,
            max_tools: MAX_TOOLS,
            max_items_in_row: MAX_ITEMS_IN_ROW,
            step_max_items: STEP_MAX_ITEMS,
            initial_lexer_fuel: INITIAL_LEXER_FUEL,
            step_lexer_fuel: STEP_LEXER_FUEL,
            max_lexer_states: MAX_LEXER_STATES,
            max_grammar_size: MAX_GRAMMAR_SIZE,
        }
    }
}

/// `got` if it is within `limit`, else the error naming `what`.
pub(crate) fn within(what: &'static str, got: usize, limit: usize) -> Result<(), GrammarError> {
    if got > limit {
        return Err(GrammarError::Limit { what, limit, got });
    }
    Ok(())
}

impl GrammarLimits {
    /// Checks `spec` against the limits, without recursion and in time linear in its size.
    pub fn check(&self, spec: &GrammarSpec) -> Result<(), GrammarError> {
        let mut totals = Totals::default();
        match spec {
            GrammarSpec::JsonSchema(schema) => scan_schema(schema, self, &mut totals)?,
            GrammarSpec::JsonObject => {}
            GrammarSpec::Regex(rx) => {
                scan_regex("bytes of the regex", rx, self.max_regex_bytes, self)?
            }
            GrammarSpec::Lark(lark) => scan_lark(lark, self, &mut totals)?,
            GrammarSpec::ToolCall(calls) => {
                within("functions of the tool call", calls.len(), self.max_tools)?;
                for call in calls {
                    scan_schema(&call.parameters, self, &mut totals)?;
                }
            }
            GrammarSpec::OptionalToolCalls(spec) => {
                let bare = spec.bare.as_ref().map_or(&[][..], |b| &b.functions[..]);
                let functions = spec.calls.len().max(bare.len());
                within("functions of the tool calls", functions, self.max_tools)?;
                for call in &spec.calls {
                    scan_schema(&call.parameters, self, &mut totals)?;
                }
                // The same functions as JSON calls: counted once where they are the same.
                for (i, (_, schema)) in bare.iter().enumerate() {
                    if spec.calls.get(i).is_none_or(|c| c.parameters != *schema) {
                        scan_schema(schema, self, &mut totals)?;
                    }
                }
                if let Some(answer) = &spec.answer {
                    scan_schema(answer, self, &mut totals)?;
                }
            }
            GrammarSpec::StructuralTag(tag) => self.check_tag(tag, &mut totals)?,
        }
        Ok(())
    }

    fn check_tag(&self, tag: &StructuralTag, totals: &mut Totals) -> Result<(), GrammarError> {
        within(
            "structures of the structural tag",
            tag.structures.len(),
            self.max_structures,
        )?;
        within(
            "triggers of the structural tag",
            tag.triggers.len(),
            self.max_triggers,
        )?;
        let texts = tag.triggers.iter().chain(
            tag.structures
                .iter()
                .flat_map(|s| [&s.begin, &s.end].into_iter()),
        );
        let longest = texts.map(String::len).max().unwrap_or(0);
        within(
            "bytes of a structural tag's trigger, begin or end",
            longest,
            self.max_tag_bytes,
        )?;
        for s in &tag.structures {
            scan_schema(&s.schema, self, totals)?;
        }
        Ok(())
    }

    /// llguidance's own limits, set with these.
    pub(crate) fn parser_limits(&self) -> ParserLimits {
        ParserLimits {
            max_items_in_row: self.max_items_in_row,
            initial_lexer_fuel: self.initial_lexer_fuel,
            step_lexer_fuel: self.step_lexer_fuel,
            step_max_items: self.step_max_items,
            max_lexer_states: self.max_lexer_states,
            max_grammar_size: self.max_grammar_size,
            precompute_large_lexemes: true,
            // Errors are cut to their first line: the state and grammar after it are not kept.
            verbose_errors: false,
        }
    }
}

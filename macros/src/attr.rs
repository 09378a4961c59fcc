//! Parsing of `#[event(...)]` and `#[processor(...)]`.
//!
//! Parsing never stops at the first mistake: each one is pushed to [`Errors`] with the
//! user's span, and parsing goes on with the next key, so that one build shows them all.

use std::collections::BTreeMap;

use proc_macro2::{Span, TokenTree};
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::spanned::Spanned;
use syn::{Attribute, DeriveInput, Expr, ExprLit, Ident, Lit, LitStr, Meta, Token, Type};

/// The errors found so far, reported together as one `syn::Error`.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(errors) => errors.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn error(&mut self, span: Span, message: impl std::fmt::Display) {
        self.push(syn::Error::new(span, message));
    }

    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, message: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// `Err` with every error pushed, or `Ok(value)` when there is none.
    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(errors) => Err(errors),
            None => Ok(value),
        }
    }
}

/// A path as the user wrote it, for messages.
fn path_text(path: &syn::Path) -> String {
    path.to_token_stream().to_string().replace(' ', "")
}

/// Skips whatever follows a key up to the next top-level `,`, so that parsing can go on
/// after a mistake.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    while !meta.input.is_empty() && !meta.input.peek(Token![,]) {
        meta.input.parse::<TokenTree>()?;
    }
    Ok(())
}

/// Pushes the error of a nested-meta parse that could not go on.
fn push_parse_error(errors: &mut Errors, result: syn::Result<()>) -> bool {
    match result {
        Ok(()) => true,
        Err(error) => {
            errors.push(error);
            false
        }
    }
}

// ---------------------------------------------------------------------------------------
// #[event(...)]

/// What a field's `#[event(...)]` attributes mark it as: the span of each marker.
#[derive(Default)]
pub(crate) struct EventField {
    pub(crate) id: Option<Span>,
    pub(crate) key: Option<Span>,
}

const EVENT_USAGE: &str =
    "write `#[event(id)]` on the event-ID field or `#[event(key)]` on the key field";

/// Reads the `#[event(...)]` attributes of one field.
pub(crate) fn event_field(attrs: &[Attribute], errors: &mut Errors) -> EventField {
    let mut field = EventField::default();
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("event")) {
        let list = match &attr.meta {
            Meta::List(list) => list,
            Meta::Path(_) => {
                errors.spanned(
                    attr,
                    format!("`#[event]` needs to say what the field is: {EVENT_USAGE}"),
                );
                continue;
            }
            Meta::NameValue(_) => {
                errors.spanned(
                    attr,
                    format!("`#[event = ...]` is not supported: {EVENT_USAGE}"),
                );
                continue;
            }
        };
        if list.tokens.is_empty() {
            errors.spanned(attr, format!("`#[event()]` is empty: {EVENT_USAGE}"));
            continue;
        }
        let result = list.parse_nested_meta(|meta| {
            let marker = if meta.path.is_ident("id") {
                &mut field.id
            } else if meta.path.is_ident("key") {
                &mut field.key
            } else {
                skip_value(&meta)?;
                errors.push(meta.error(format!(
                    "unknown `event` attribute `{}`; the accepted ones are `id` (this field is \
                     the event ID) and `key` (this field is the event's key)",
                    path_text(&meta.path)
                )));
                return Ok(());
            };
            let name = path_text(&meta.path);
            if !meta.input.is_empty() && !meta.input.peek(Token![,]) {
                skip_value(&meta)?;
                errors
                    .push(meta.error(format!("`{name}` takes no value: write `#[event({name})]`")));
                return Ok(());
            }
            if marker.is_some() {
                errors
                    .push(meta.error(format!("`{name}` is given twice on this field; remove one")));
                return Ok(());
            }
            *marker = Some(meta.path.span());
            Ok(())
        });
        push_parse_error(errors, result);
    }
    field
}

/// `#[event(...)]` on the type itself, where it means nothing: an error for each.
pub(crate) fn event_misplaced(attrs: &[Attribute], errors: &mut Errors) {
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("event")) {
        errors.spanned(
            attr,
            format!("`#[event(...)]` goes on a field, not on the type: {EVENT_USAGE}"),
        );
    }
}

// ---------------------------------------------------------------------------------------
// #[processor(...)]

/// A checked `#[processor(...)]`.
pub(crate) struct ProcessorArgs {
    pub(crate) name: LitStr,
    pub(crate) input_type: Type,
    pub(crate) input: Option<LitStr>,
    pub(crate) outputs: Vec<LitStr>,
    pub(crate) handler: Option<Ident>,
    /// `timer = method`: the method `on_timer` calls; the processor uses timers.
    pub(crate) timer: Option<Ident>,
    /// `codec = Cbor`: the codec value the input is decoded with (default JSON).
    pub(crate) codec: Option<Expr>,
}

const PROCESSOR_KEYS: &str =
    "`name`, `input_type`, `input`, `outputs`, `handler`, `timer` and `codec`";

/// A key given in `#[processor(...)]`: where it was given, and its value if that was valid.
struct Slot<T> {
    given: Option<Span>,
    value: Option<T>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self {
            given: None,
            value: None,
        }
    }
}

/// Reads the type's `#[processor(...)]` attributes (they may be split over several). `None`
/// when a required key is missing or something could not be read; the errors say why.
pub(crate) fn processor_args(input: &DeriveInput, errors: &mut Errors) -> Option<ProcessorArgs> {
    let ident = &input.ident;
    let example_name = kebab_case(&ident.to_string());
    let attrs: Vec<&Attribute> = input
        .attrs
        .iter()
        .filter(|attr| attr.path().is_ident("processor"))
        .collect();
    let Some(first) = attrs.first() else {
        errors.spanned(
            ident,
            format!(
                "`#[derive(Processor)]` needs a `#[processor(...)]` attribute naming the processor \
                 and the event type it consumes: add `#[processor(name = \"{example_name}\", \
                 input_type = Order)]` above `{ident}` (optional keys: `input = \"topic\"`, \
                 `outputs = [\"topic\", ...]`, `handler = method`)"
            ),
        );
        return None;
    };

    let mut name = Slot::<LitStr>::default();
    let mut input_type = Slot::<Type>::default();
    let mut input_topic = Slot::<LitStr>::default();
    let mut outputs = Slot::<Vec<LitStr>>::default();
    let mut handler = Slot::<Ident>::default();
    let mut timer = Slot::<Ident>::default();
    let mut codec = Slot::<Expr>::default();
    let mut readable = true;

    for attr in &attrs {
        let list = match &attr.meta {
            Meta::List(list) => list,
            _ => {
                errors.spanned(
                    attr,
                    format!(
                        "`#[processor]` takes a list of keys: write \
                         `#[processor(name = \"{example_name}\", input_type = Order)]`"
                    ),
                );
                readable = false;
                continue;
            }
        };
        let result = list.parse_nested_meta(|meta| {
            let key = path_text(&meta.path);
            let given = match key.as_str() {
                "name" => &mut name.given,
                "input_type" => &mut input_type.given,
                "input" => &mut input_topic.given,
                "outputs" => &mut outputs.given,
                "handler" => &mut handler.given,
                "timer" => &mut timer.given,
                "codec" => &mut codec.given,
                _ => {
                    skip_value(&meta)?;
                    errors.push(meta.error(format!(
                        "unknown `processor` attribute `{key}`; the accepted ones are {PROCESSOR_KEYS}"
                    )));
                    return Ok(());
                }
            };
            let example = match key.as_str() {
                "name" => format!("name = \"{example_name}\""),
                "input_type" => "input_type = Order".to_owned(),
                "input" => "input = \"orders\"".to_owned(),
                "outputs" => "outputs = [\"invoices\", \"audit\"]".to_owned(),
                "timer" => "timer = on_timer".to_owned(),
                "codec" => "codec = MyCodec".to_owned(),
                _ => "handler = handle".to_owned(),
            };
            if !meta.input.peek(Token![=]) {
                skip_value(&meta)?;
                errors.push(meta.error(format!("`{key}` needs a value, e.g. `{example}`")));
                return Ok(());
            }
            if given.is_some() {
                skip_value(&meta)?;
                errors.push(meta.error(format!("`{key}` is given twice; keep one")));
                return Ok(());
            }
            *given = Some(meta.path.span());
            let value = meta.value()?;
            match key.as_str() {
                "input_type" => input_type.value = type_value(value, errors)?,
                key => {
                    let expr: Expr = value.parse()?;
                    match key {
                        "name" => name.value = topic_like(&expr, key, &example, errors),
                        "input" => input_topic.value = topic_like(&expr, key, &example, errors),
                        "outputs" => outputs.value = outputs_value(&expr, &example, errors),
                        "timer" => timer.value = method_value(&expr, ident, "timer", errors),
                        "codec" => codec.value = Some(expr),
                        _ => handler.value = handler_value(&expr, ident, errors),
                    }
                }
            }
            Ok(())
        });
        readable &= push_parse_error(errors, result);
    }

    // After a syntax error the keys past it were not read: "missing" would be a guess.
    if readable {
        if name.given.is_none() {
            errors.spanned(
                first,
                format!(
                    "`#[processor(...)]` needs `name`, the processor's name in logs and metrics: \
                     add `name = \"{example_name}\"`"
                ),
            );
        }
        if input_type.given.is_none() {
            errors.spanned(
                first,
                "`#[processor(...)]` needs `input_type`, the event type `process` receives \
                 (it implements `onceflow::Event` and `serde::Deserialize`): add e.g. \
                 `input_type = Order`",
            );
        }
    }
    Some(ProcessorArgs {
        name: name.value?,
        input_type: input_type.value?,
        input: input_topic.value,
        outputs: outputs.value.unwrap_or_default(),
        handler: handler.value,
        timer: timer.value,
        codec: codec.value,
    })
}

/// `input_type = Order`: a type, not a string and not an expression.
fn type_value(
    value: syn::parse::ParseStream<'_>,
    errors: &mut Errors,
) -> syn::Result<Option<Type>> {
    if value.peek(LitStr) {
        let text: LitStr = value.parse()?;
        errors.spanned(
            &text,
            format!(
                "`input_type` takes a type, not a string: write `input_type = {}` without quotes",
                text.value()
            ),
        );
        return Ok(None);
    }
    if value.fork().parse::<Type>().is_ok() {
        return value.parse().map(Some);
    }
    let expr: Expr = value.parse()?;
    errors.spanned(
        &expr,
        "`input_type` must be a type, the event type `process` receives, e.g. `input_type = Order`",
    );
    Ok(None)
}

/// The string literal in `expr`, if that is what it is.
fn string_literal(expr: &Expr) -> Option<&LitStr> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(text),
            ..
        }) => Some(text),
        Expr::Group(group) => string_literal(&group.expr),
        _ => None,
    }
}

/// `name = "billing"`, `input = "orders"`: a non-empty string literal.
fn topic_like(expr: &Expr, key: &str, example: &str, errors: &mut Errors) -> Option<LitStr> {
    let Some(text) = string_literal(expr) else {
        errors.spanned(
            expr,
            format!("`{key}` must be a string literal, e.g. `{example}`"),
        );
        return None;
    };
    if text.value().is_empty() {
        errors.spanned(text, format!("`{key}` must not be empty, e.g. `{example}`"));
        return None;
    }
    Some(text.clone())
}

/// `outputs = ["invoices", "audit"]`: distinct, non-empty string literals.
fn outputs_value(expr: &Expr, example: &str, errors: &mut Errors) -> Option<Vec<LitStr>> {
    let array = match expr {
        Expr::Array(array) => array,
        Expr::Group(group) => return outputs_value(&group.expr, example, errors),
        _ => {
            let message = match string_literal(expr) {
                Some(text) => format!(
                    "`outputs` takes an array of topic names: write `outputs = [{}]`",
                    text.to_token_stream()
                ),
                None => format!("`outputs` must be an array of string literals, e.g. `{example}`"),
            };
            errors.spanned(expr, message);
            return None;
        }
    };
    let mut topics = Vec::new();
    let mut seen = BTreeMap::new();
    let mut valid = true;
    for element in &array.elems {
        let Some(topic) = string_literal(element) else {
            errors.spanned(
                element,
                format!("each output must be a topic name as a string literal, e.g. `{example}`"),
            );
            valid = false;
            continue;
        };
        let name = topic.value();
        if name.is_empty() {
            errors.spanned(topic, "an output topic name must not be empty");
            valid = false;
        } else if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            errors.spanned(
                topic,
                format!(
                    "`{name}` is not a Kafka topic name: use only a-z, A-Z, 0-9, '.', '_' and '-'"
                ),
            );
            valid = false;
        } else if let Some(other) = seen.insert(topic_const_name(&name), name.clone()) {
            let message = if other == name {
                format!("output topic `{name}` is listed twice in `outputs`; remove one")
            } else {
                format!(
                    "outputs `{other}` and `{name}` would both be the constant `{}`; \
                     rename one topic",
                    topic_const_name(&name)
                )
            };
            errors.spanned(topic, message);
            valid = false;
        }
        topics.push(topic.clone());
    }
    valid.then_some(topics)
}

/// The name of the `Topic` constant the derive generates for an output topic:
/// `invoices` -> `INVOICES`, `audit-log.v2` -> `AUDIT_LOG_V2`, `2024-orders` -> `T_2024_ORDERS`.
pub(crate) fn topic_const_name(topic: &str) -> String {
    let upper: String = topic
        .chars()
        .map(|c| match c {
            '.' | '-' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    if upper.starts_with(|c: char| c.is_ascii_digit()) || upper.chars().all(|c| c == '_') {
        format!("T_{upper}")
    } else {
        upper
    }
}

/// `handler = handle_order`: the name of an inherent method.
fn handler_value(expr: &Expr, ty: &Ident, errors: &mut Errors) -> Option<Ident> {
    method_value(expr, ty, "handler", errors)
}

/// `handler = handle_order`, `timer = on_timer`: the name of an inherent method.
fn method_value(expr: &Expr, ty: &Ident, key: &str, errors: &mut Errors) -> Option<Ident> {
    let (example, signature) = match key {
        "timer" => ("on_timer", "timer: onceflow::Timer, ctx"),
        _ => ("handle_order", "input, ctx"),
    };
    if let Expr::Path(path) = expr
        && path.qself.is_none()
        && path.attrs.is_empty()
        && let Some(ident) = path.path.get_ident()
    {
        return Some(ident.clone());
    }
    if let Some(text) = string_literal(expr) {
        let message = match syn::parse_str::<Ident>(&text.value()) {
            Ok(ident) => format!(
                "`{key}` takes the method's name, not a string: write `{key} = {ident}` without quotes"
            ),
            Err(_) => {
                format!("`{key}` takes the name of a method of `{ty}`, e.g. `{key} = {example}`")
            }
        };
        errors.spanned(text, message);
        return None;
    }
    errors.spanned(
        expr,
        format!(
            "`{key}` must be the name of an inherent method of `{ty}` (`async fn(&mut self, \
             {signature}) -> onceflow::Result<()>`), e.g. `{key} = {example}`"
        ),
    );
    None
}

/// `BillingProcessor` → `billing-processor`, for examples in messages.
fn kebab_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (index, c) in name.chars().enumerate() {
        if c.is_uppercase() {
            if index > 0 {
                out.push('-');
            }
            out.extend(c.to_lowercase());
        } else if c == '_' {
            out.push('-');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use syn::parse::Parser;

    use super::*;

    #[test]
    fn topic_constants_are_upper_snake_case_identifiers() {
        assert_eq!(topic_const_name("invoices"), "INVOICES");
        assert_eq!(topic_const_name("audit-log.v2"), "AUDIT_LOG_V2");
        assert_eq!(topic_const_name("Rejected_Transfers"), "REJECTED_TRANSFERS");
        assert_eq!(topic_const_name("2024-orders"), "T_2024_ORDERS");
        assert_eq!(topic_const_name("-"), "T__");
    }

    fn parse(source: &str) -> (Option<ProcessorArgs>, Vec<String>) {
        let input: DeriveInput = syn::parse_str(source).expect("valid item");
        let mut errors = Errors::default();
        let args = processor_args(&input, &mut errors);
        let messages = match errors.finish(()) {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        };
        (args, messages)
    }

    #[test]
    fn reads_every_key() {
        let (args, errors) = parse(
            r#"#[processor(name = "billing", input = "orders", input_type = Vec<Order>,
                           outputs = ["invoices", "audit"], handler = on_order,
                           timer = on_tick)]
               struct Billing;"#,
        );
        assert!(errors.is_empty(), "{errors:?}");
        let args = args.expect("args");
        assert_eq!(args.name.value(), "billing");
        assert_eq!(args.input.expect("input").value(), "orders");
        assert_eq!(
            args.input_type.to_token_stream().to_string(),
            "Vec < Order >"
        );
        let outputs: Vec<String> = args.outputs.iter().map(LitStr::value).collect();
        assert_eq!(outputs, ["invoices", "audit"]);
        assert_eq!(args.handler.expect("handler").to_string(), "on_order");
        assert_eq!(args.timer.expect("timer").to_string(), "on_tick");
    }

    #[test]
    fn reports_every_mistake_at_once() {
        let (args, errors) = parse(
            r#"#[processor(nmae = "x", name = 5, outputs = ["a", "a"], handler = "go")]
               struct BillingJob;"#,
        );
        assert!(args.is_none());
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!(errors[0].contains("unknown `processor` attribute `nmae`"));
        assert!(errors[1].contains("`name` must be a string literal"));
        assert!(errors[2].contains("`a` is listed twice"));
        assert!(errors[3].contains("write `handler = go` without quotes"));
        assert!(errors[4].contains("needs `input_type`"));
    }

    #[test]
    fn a_repeated_key_is_an_error() {
        let (_, errors) =
            parse(r#"#[processor(name = "a", input_type = A)] #[processor(name = "b")] struct A;"#);
        assert_eq!(errors, ["`name` is given twice; keep one"]);
    }

    #[test]
    fn suggests_a_name_from_the_type() {
        assert_eq!(kebab_case("BillingProcessor"), "billing-processor");
        let (_, errors) = parse("struct FraudCheck;");
        assert!(errors[0].contains("name = \"fraud-check\""), "{errors:?}");
    }

    #[test]
    fn event_markers() {
        let field: syn::Field = syn::Field::parse_named
            .parse_str("#[event(id)] #[event(key, id = \"x\", ttl)] id: String")
            .expect("field");
        let mut errors = Errors::default();
        let marked = event_field(&field.attrs, &mut errors);
        assert!(marked.id.is_some() && marked.key.is_some());
        let messages: Vec<String> = errors
            .finish(())
            .expect_err("errors")
            .into_iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(messages[0].contains("`id` takes no value"));
        assert!(messages[1].contains("unknown `event` attribute `ttl`"));
    }
}

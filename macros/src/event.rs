//! `#[derive(Event)]`: `event_id` from the `#[event(id)]` field, `key` from the
//! `#[event(key)]` field.

use std::collections::BTreeSet;

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Field, Fields, Generics, Ident, Token, Type};

use crate::attr::{self, Errors};

const SUPPORTED: &str = "`#[derive(Event)]` supports structs with named fields";

pub(crate) fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    attr::event_misplaced(&input.attrs, &mut errors);
    let ident = &input.ident;
    let fields = match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(fields) => Some(&fields.named),
            Fields::Unnamed(fields) => {
                errors.spanned(
                    fields,
                    format!(
                        "{SUPPORTED}; name the fields (`struct {ident} {{ id: String, .. }}`) \
                         or implement `onceflow::Event` by hand"
                    ),
                );
                None
            }
            Fields::Unit => {
                errors.spanned(
                    ident,
                    format!(
                        "{SUPPORTED}; a unit struct has no ID or key: write \
                         `impl onceflow::Event for {ident} {{}}` (both methods have defaults)"
                    ),
                );
                None
            }
        },
        Data::Enum(data) => {
            let enum_token = data.enum_token;
            errors.spanned(
                quote!(#enum_token #ident),
                format!("{SUPPORTED}; implement `onceflow::Event` by hand for enums"),
            );
            None
        }
        Data::Union(data) => {
            let union_token = data.union_token;
            errors.spanned(
                quote!(#union_token #ident),
                format!("{SUPPORTED}; implement `onceflow::Event` by hand for unions"),
            );
            None
        }
    };
    let (id, key) = match fields {
        Some(fields) => marked_fields(fields, &mut errors),
        None => (None, None),
    };
    errors.finish(())?;

    let mut generics = input.generics.clone();
    let params = type_params(&generics);
    let event_id = match id {
        Some(field) => {
            let name = &field.ident;
            let ty = &field.ty;
            if mentions(ty, &params) {
                bound(&mut generics, ty, quote!(::onceflow::__private::EventId));
            }
            // The field type's span: an unsupported ID type is reported at the field.
            quote_spanned! {ty.span()=>
                ::onceflow::__private::EventId::to_event_id(&self.#name)
            }
        }
        None => quote!(::onceflow::__private::Option::None),
    };
    let key = match key {
        Some(field) => {
            let name = &field.ident;
            let ty = &field.ty;
            if mentions(ty, &params) {
                bound(&mut generics, ty, quote!(::onceflow::__private::ToString));
            }
            let to_string = quote_spanned! {ty.span()=>
                ::onceflow::__private::ToString::to_string(&self.#name)
            };
            quote!(::onceflow::__private::Option::Some(#to_string))
        }
        None => quote!(::onceflow::__private::Option::None),
    };

    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    Ok(quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics ::onceflow::__private::Event for #ident #ty_generics #where_clause {
                fn event_id(&self) -> ::onceflow::__private::Option<::onceflow::__private::String> {
                    #event_id
                }

                fn key(&self) -> ::onceflow::__private::Option<::onceflow::__private::String> {
                    #key
                }
            }
        };
    })
}

/// The `#[event(id)]` and `#[event(key)]` fields; a second of either is an error.
fn marked_fields<'a>(
    fields: &'a Punctuated<Field, Token![,]>,
    errors: &mut Errors,
) -> (Option<&'a Field>, Option<&'a Field>) {
    let mut id: Option<&Field> = None;
    let mut key: Option<&Field> = None;
    for field in fields {
        let marked = attr::event_field(&field.attrs, errors);
        for (span, slot, what, marker) in [
            (marked.id, &mut id, "event-ID field", "id"),
            (marked.key, &mut key, "key field", "key"),
        ] {
            let Some(span) = span else { continue };
            match slot {
                Some(first) => errors.error(
                    span,
                    format!(
                        "`{}` is already the {what}, and an event has only one: remove \
                         `#[event({marker})]` from `{}` or from `{}`",
                        name(first),
                        name(first),
                        name(field),
                    ),
                ),
                None => *slot = Some(field),
            }
        }
    }
    (id, key)
}

fn name(field: &Field) -> String {
    field
        .ident
        .as_ref()
        .map_or_else(String::new, ToString::to_string)
}

fn type_params(generics: &Generics) -> BTreeSet<Ident> {
    generics
        .type_params()
        .map(|param| param.ident.clone())
        .collect()
}

/// Whether `ty` names one of the type parameters: then the impl needs a bound on it.
fn mentions(ty: &Type, params: &BTreeSet<Ident>) -> bool {
    fn walk(tokens: TokenStream, params: &BTreeSet<Ident>) -> bool {
        tokens.into_iter().any(|token| match token {
            TokenTree::Ident(ident) => params.contains(&ident),
            TokenTree::Group(group) => walk(group.stream(), params),
            TokenTree::Punct(_) | TokenTree::Literal(_) => false,
        })
    }
    !params.is_empty() && walk(ty.to_token_stream(), params)
}

/// Adds `ty: bound` to the impl's where clause, spanned at the field type.
fn bound(generics: &mut Generics, ty: &Type, bound: TokenStream) {
    let span: Span = ty.span();
    generics
        .make_where_clause()
        .predicates
        .push(syn::parse_quote_spanned!(span=> #ty: #bound));
}

//! `#[derive(Processor)]`: the `Processor` trait from `#[processor(...)]`, with `process`
//! forwarding to an inherent async method (`handle` by default).

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{Data, DeriveInput, Ident};

use crate::attr::{self, Errors, ProcessorArgs};

pub(crate) fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let mut errors = Errors::default();
    let ident = &input.ident;
    if let Data::Union(data) = &input.data {
        let union_token = data.union_token;
        errors.spanned(
            quote!(#union_token #ident),
            "`#[derive(Processor)]` does not support unions; derive it on a struct (or an enum) \
             that holds the processor's fields",
        );
    }
    let args = attr::processor_args(input, &mut errors);
    let ProcessorArgs {
        name,
        input_type,
        input: input_topic,
        outputs,
        handler,
        timer,
        codec,
    } = errors.finish(args)?.ok_or_else(|| {
        // Unreachable in practice: whatever made the arguments unusable was reported.
        syn::Error::new_spanned(
            ident,
            "`#[derive(Processor)]` could not read `#[processor(...)]`",
        )
    })?;

    let input_topic = match input_topic {
        Some(topic) => quote!(::onceflow::__private::Option::Some(#topic)),
        None => quote!(::onceflow::__private::Option::None),
    };
    // A missing method is reported at `handler = ...`, or at the derive for the default.
    let handler = handler.unwrap_or_else(|| Ident::new("handle", Span::call_site()));
    let timers = timer.map(|timer| {
        quote! {
            fn uses_timers(&self) -> bool {
                true
            }

            async fn on_timer(
                &mut self,
                timer: ::onceflow::__private::Timer,
                ctx: &mut ::onceflow::__private::Context<'_>,
            ) -> ::onceflow::__private::Result<()> {
                Self::#timer(self, timer, ctx).await
            }
        }
    });
    let decode = codec.map(|codec| {
        quote! {
            fn decode_input(
                &self,
                bytes: &[u8],
            ) -> ::onceflow::__private::StdResult<#input_type, ::onceflow::__private::String> {
                ::onceflow::__private::Codec::decode(&#codec, bytes)
            }
        }
    });
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let vis = &input.vis;
    let constants = outputs.iter().map(|topic| {
        let name = Ident::new(&attr::topic_const_name(&topic.value()), topic.span());
        let doc = format!(
            "Output topic `{}`, declared in `#[processor(outputs = ...)]`.",
            topic.value()
        );
        quote! {
            #[doc = #doc]
            #vis const #name: ::onceflow::__private::Topic =
                ::onceflow::__private::Topic::__declared(#topic);
        }
    });
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #ident #ty_generics #where_clause {
            #(#constants)*
        }


        const _: () = {
            #[automatically_derived]
            #[::onceflow::__private::async_trait]
            impl #impl_generics ::onceflow::__private::Processor for #ident #ty_generics #where_clause {
                type Input = #input_type;

                fn name(&self) -> &str {
                    #name
                }

                fn input_topic(&self) -> ::onceflow::__private::Option<&str> {
                    #input_topic
                }

                fn output_topics(&self) -> &[&str] {
                    &[#(#outputs),*]
                }

                fn version(&self) -> ::onceflow::__private::Option<&str> {
                    ::core::option_env!("CARGO_PKG_VERSION")
                }

                async fn process(
                    &mut self,
                    input: #input_type,
                    ctx: &mut ::onceflow::__private::Context<'_>,
                ) -> ::onceflow::__private::Result<()> {
                    Self::#handler(self, input, ctx).await
                }

                #timers

                #decode
            }
        };
    })
}

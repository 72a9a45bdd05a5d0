//! `#[ferriq::task]`: turns an `async fn` into a registered ferriq task.
//!
//! Use it through the `ferriq` crate (`#[ferriq::task(name = "…")]`); the generated code names
//! only `::ferriq::…` paths. See `ferriq::task` for the options.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{
    parse_macro_input, Error, FnArg, GenericArgument, ItemFn, Pat, PathArguments, ReturnType, Type,
};

mod options;

use options::TaskAttr;

/// Defines a ferriq task from an `async fn`. See `ferriq::task`.
#[proc_macro_attribute]
pub fn task(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr = parse_macro_input!(attr as TaskAttr);
    let func = parse_macro_input!(item as ItemFn);
    match expand(attr, func) {
        Ok(tokens) => tokens.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What a parameter of the task function is.
enum Param {
    /// An argument bound from args/kwargs.
    Arg { name: syn::Ident, ty: Box<Type> },
    /// The run's `TaskContext`.
    Context,
    /// App state: `State<T>`.
    State { inner: Type },
}

fn expand(attr: TaskAttr, func: ItemFn) -> syn::Result<TokenStream2> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(Error::new(
            sig.fn_token.span(),
            "#[ferriq::task] needs an `async fn`: tasks run on the worker's async runtime",
        ));
    }
    if let Some(unsafety) = &sig.unsafety {
        return Err(Error::new(
            unsafety.span(),
            "a task cannot be an `unsafe fn`",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(Error::new(
            sig.generics.span(),
            "a task cannot be generic: each task name must map to one concrete function",
        ));
    }
    if let Some(v) = &sig.variadic {
        return Err(Error::new(v.span(), "a task cannot be variadic"));
    }
    let params = sig
        .inputs
        .iter()
        .map(classify_param)
        .collect::<syn::Result<Vec<_>>>()?;
    let output = output_type(&sig.output)?;
    if let Type::Reference(r) = &output {
        return Err(Error::new(
            r.span(),
            "a task's output must be an owned type (`String`, not `&str`): callers deserialize it from the stored result",
        ));
    }
    let returns_result = is_result(&sig.output);

    let fn_name = &sig.ident;
    let vis = &func.vis;
    let name_expr = match &attr.name {
        Some(name) => quote!(#name),
        None => {
            let fn_str = fn_name.to_string();
            quote!(::core::concat!(::core::module_path!(), ":", #fn_str))
        }
    };
    let schedule = attr.schedule_expr();

    let arg_names: Vec<&syn::Ident> = params
        .iter()
        .filter_map(|p| match p {
            Param::Arg { name, .. } => Some(name),
            _ => None,
        })
        .collect();
    let plain_names: Vec<String> = arg_names
        .iter()
        .map(|n| n.to_string().trim_start_matches("r#").to_owned())
        .collect();
    let options = attr.options_expr(&plain_names);
    let arg_types: Vec<&Type> = params
        .iter()
        .filter_map(|p| match p {
            Param::Arg { ty, .. } => Some(&**ty),
            _ => None,
        })
        .collect();
    let arg_strs: Vec<String> = arg_names
        .iter()
        .map(|n| n.to_string().trim_start_matches("r#").to_owned())
        .collect();
    let client_ident = if arg_strs.iter().any(|n| n == "client") {
        format_ident!("__ferriq_client")
    } else {
        format_ident!("client")
    };

    // The body of the run function: bind arguments, inject context/state, call the function.
    let mut binds = Vec::new();
    let mut call_args = Vec::new();
    let mut states = Vec::new();
    let mut arg_index = 0usize;
    for (i, p) in params.iter().enumerate() {
        let local = format_ident!("__ferriq_p{}", i);
        match p {
            Param::Arg { ty, .. } => {
                let idx = arg_index;
                arg_index += 1;
                binds.push(quote_spanned! {ty.span()=>
                    let #local: #ty = __ferriq_binder
                        .take(#idx)
                        .map_err(::ferriq::TaskError::invalid_arguments)?;
                });
            }
            Param::Context => binds.push(quote! { let #local = __ferriq_inv.context(); }),
            Param::State { inner } => {
                states.push(quote!(::ferriq::__private::StateRequirement::of::<#inner>()));
                binds.push(quote! {
                    let #local: ::ferriq::State<#inner> = __ferriq_inv.state::<#inner>()?;
                });
            }
        }
        call_args.push(local);
    }
    let convert = if returns_result {
        quote!(::ferriq::__private::result_output(__ferriq_out))
    } else {
        quote!(::ferriq::__private::ok_output(__ferriq_out))
    };
    let doc_struct = format!(
        "The ferriq task defined by [`fn@{fn_name}`]: its wire name, options and typed enqueue \
         functions (`{fn_name}::kiq(&client, …)`)."
    );

    let registration = quote! {
        ::ferriq::__private::TaskRegistration::new(
            #fn_name::NAME,
            #fn_name::OPTIONS,
            __ferriq_run,
            &[#(#states),*],
            ::core::file!(),
            ::core::line!(),
        )#schedule
    };
    let registered = if attr.inventory.unwrap_or(true) {
        quote! { ::ferriq::inventory::submit! { #registration } }
    } else {
        quote! {
            impl #fn_name {
                /// This task's registration, for `Registry::from_registrations` (declared
                /// with `inventory = false`, it is not in `Registry::from_inventory()`).
                pub fn registration() -> &'static ::ferriq::__private::TaskRegistration {
                    static REGISTRATION: ::ferriq::__private::TaskRegistration = #registration;
                    &REGISTRATION
                }
            }
        }
    };

    Ok(quote! {
        #func

        #[doc = #doc_struct]
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy)]
        #vis struct #fn_name {
            _private: (),
        }

        #[allow(dead_code, clippy::too_many_arguments)]
        impl #fn_name {
            /// The task's wire name: the stable contract producers and workers share.
            pub const NAME: &'static str = #name_expr;
            /// The task's options.
            pub const OPTIONS: ::ferriq::TaskOptions = #options;

            /// A call of this task with typed arguments, to enqueue (alone or in a batch).
            pub fn call(#(#arg_names: #arg_types),*) -> ::ferriq::Call<#output> {
                ::ferriq::Call::new(
                    Self::NAME,
                    Self::OPTIONS,
                    [#(::ferriq::__private::to_arg(&#arg_names)),*],
                )
            }

            /// Enqueues this task; returns once the broker holds the message durably.
            pub async fn kiq(
                #client_ident: &::ferriq::Client,
                #(#arg_names: #arg_types),*
            ) -> ::core::result::Result<::ferriq::TaskHandle<#output>, ::ferriq::EnqueueError> {
                #client_ident.enqueue(Self::call(#(#arg_names),*)).await
            }
        }

        impl ::ferriq::Task for #fn_name {
            const NAME: &'static str = #fn_name::NAME;
            const OPTIONS: ::ferriq::TaskOptions = #fn_name::OPTIONS;
            type Output = #output;
        }

        const _: () = {
            const __FERRIQ_PARAMS: &[&str] = &[#(#arg_strs),*];

            #[allow(unused_variables, unused_mut)]
            fn __ferriq_run(
                mut __ferriq_inv: ::ferriq::__private::Invocation,
            ) -> ::ferriq::__private::RunFuture {
                ::std::boxed::Box::pin(async move {
                    let mut __ferriq_binder = __ferriq_inv.bind(__FERRIQ_PARAMS)?;
                    #(#binds)*
                    let __ferriq_out = #fn_name(#(#call_args),*).await;
                    #convert
                })
            }

            #registered
        };
    })
}

fn classify_param(input: &FnArg) -> syn::Result<Param> {
    let typed =
        match input {
            FnArg::Receiver(r) => return Err(Error::new(
                r.span(),
                "#[ferriq::task] cannot take `self`: a task is a free function known by its name",
            )),
            FnArg::Typed(t) => t,
        };
    let name = match &*typed.pat {
        Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.ident.clone(),
        other => {
            return Err(Error::new(
                other.span(),
                "task parameters must be plain names (`amount: i64`): arguments bind by name",
            ))
        }
    };
    let ty = &*typed.ty;
    match ty {
        Type::Reference(r) => {
            return Err(Error::new(
                r.span(),
                "task parameters must be owned types (`String`, not `&str`; `TaskContext`, not \
                 `&TaskContext`): arguments are deserialized from the message",
            ))
        }
        Type::ImplTrait(t) => {
            return Err(Error::new(
                t.span(),
                "a task parameter cannot be `impl Trait`: it must deserialize into a concrete type",
            ))
        }
        _ => {}
    }
    if let Type::Path(p) = ty {
        if let Some(last) = p.path.segments.last() {
            if last.ident == "TaskContext" && last.arguments.is_empty() {
                return Ok(Param::Context);
            }
            if last.ident == "State" {
                if let PathArguments::AngleBracketed(args) = &last.arguments {
                    if let (1, Some(GenericArgument::Type(inner))) =
                        (args.args.len(), args.args.first())
                    {
                        return Ok(Param::State {
                            inner: inner.clone(),
                        });
                    }
                }
                return Err(Error::new(
                    last.span(),
                    "app state is taken as `State<T>` with one type",
                ));
            }
        }
    }
    Ok(Param::Arg {
        name,
        ty: Box::new(ty.clone()),
    })
}

/// The return type is a `Result`: its last path segment is `Result` or ends in `Result`
/// (`io::Result<T>`, an app's `AppResult<T>` alias), so its first type argument is the output.
fn is_result(output: &ReturnType) -> bool {
    match output {
        ReturnType::Type(_, ty) => match &**ty {
            Type::Path(p) => p.path.segments.last().is_some_and(is_result_segment),
            _ => false,
        },
        ReturnType::Default => false,
    }
}

fn is_result_segment(segment: &syn::PathSegment) -> bool {
    segment.ident.to_string().ends_with("Result")
        && matches!(segment.arguments, PathArguments::AngleBracketed(_))
}

/// The task's output type: `T` of `Result<T, E>`, the type itself, or `()`.
fn output_type(output: &ReturnType) -> syn::Result<Type> {
    let ty = match output {
        ReturnType::Default => return Ok(syn::parse_quote!(())),
        ReturnType::Type(_, ty) => &**ty,
    };
    if let Type::ImplTrait(t) = ty {
        return Err(Error::new(
            t.span(),
            "a task cannot return `impl Trait`: its output must be a concrete serializable type",
        ));
    }

    if let Type::Path(p) = ty {
        if let Some(last) = p.path.segments.last() {
            if is_result_segment(last) || last.ident == "Result" {
                if let PathArguments::AngleBracketed(args) = &last.arguments {
                    if let Some(GenericArgument::Type(ok)) = args.args.first() {
                        return Ok(ok.clone());
                    }
                }
                return Err(Error::new(
                    last.span(),
                    "write the task's result type in full (`Result<T, E>`) so its output type is known",
                ));
            }
        }
    }
    Ok(ty.clone())
}

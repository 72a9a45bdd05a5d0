//! Parsing of `#[task(…)]` options.

use proc_macro2::TokenStream as TokenStream2;
use quote::quote;
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Error, Expr, ExprLit, Lit, LitStr, MetaNameValue, Token};

const KNOWN: &str = "name, max_attempts, timeout, queue, backoff_initial, backoff_max, \
                     retry_on_error, store_result, deadline, park_fatal, rate, rate_key, concurrency, \
                     concurrency_key, unique_for, dedup, dedup_key, schedule, every, timezone, missed, \
                     catch_up_max, no_overlap, schedule_args, inventory";

/// The parsed options.
#[derive(Default)]
pub(crate) struct TaskAttr {
    pub(crate) name: Option<LitStr>,
    max_attempts: Option<u32>,
    timeout_ms: Option<u64>,
    queue: Option<LitStr>,
    backoff_initial_ms: Option<u64>,
    backoff_max_ms: Option<u64>,
    retry_on_error: Option<bool>,
    store_result: Option<bool>,
    deadline_ms: Option<u64>,
    park_fatal: Option<bool>,
    /// Starts allowed and the period in seconds.
    rate: Option<(u32, u64)>,
    rate_key: Option<LitStr>,
    concurrency: Option<u32>,
    concurrency_key: Option<LitStr>,
    unique_for_ms: Option<u64>,
    /// `active`, `window` or `debounce`.
    dedup: Option<LitStr>,
    dedup_key: Option<LitStr>,
    schedule: Option<LitStr>,
    every: Option<u64>,
    timezone: Option<LitStr>,
    missed: Option<LitStr>,
    catch_up_max: Option<u32>,
    no_overlap: Option<bool>,
    schedule_args: Option<LitStr>,
    /// `false`: not submitted to the inventory; the task's `registration()` is added by hand.
    pub(crate) inventory: Option<bool>,
}

impl Parse for TaskAttr {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let items = Punctuated::<MetaNameValue, Token![,]>::parse_terminated(input)?;
        let mut attr = TaskAttr::default();
        let mut seen: Vec<String> = Vec::new();
        for item in items {
            let key = item
                .path
                .get_ident()
                .map(|i| i.to_string())
                .ok_or_else(|| {
                    Error::new_spanned(&item.path, format!("expected one of: {KNOWN}"))
                })?;
            if seen.contains(&key) {
                return Err(Error::new_spanned(
                    &item.path,
                    format!("duplicate option `{key}`: give it once"),
                ));
            }
            seen.push(key.clone());
            let lit = match &item.value {
                Expr::Lit(ExprLit { lit, .. }) => lit.clone(),
                other => {
                    return Err(Error::new_spanned(
                        other,
                        format!("option `{key}` takes a literal value"),
                    ))
                }
            };
            match key.as_str() {
                "name" => {
                    let s = str_lit(&key, &lit)?;
                    if s.value().trim().is_empty() {
                        return Err(Error::new_spanned(&lit, "a task name cannot be empty"));
                    }
                    attr.name = Some(s);
                }
                "queue" => {
                    let s = str_lit(&key, &lit)?;
                    if s.value().trim().is_empty() {
                        return Err(Error::new_spanned(&lit, "a queue name cannot be empty"));
                    }
                    attr.queue = Some(s);
                }
                "max_attempts" => {
                    let n = match &lit {
                        Lit::Int(i) => i.base10_parse::<u32>()?,
                        _ => {
                            return Err(Error::new_spanned(
                                &lit,
                                "max_attempts takes a whole number",
                            ))
                        }
                    };
                    if n == 0 {
                        return Err(Error::new_spanned(
                            &lit,
                            "max_attempts counts the first run: use 1 or more",
                        ));
                    }
                    attr.max_attempts = Some(n);
                }
                "timeout" => attr.timeout_ms = Some(secs_lit(&key, &lit)?),
                "backoff_initial" => attr.backoff_initial_ms = Some(secs_lit(&key, &lit)?),
                "backoff_max" => attr.backoff_max_ms = Some(secs_lit(&key, &lit)?),
                "retry_on_error" => attr.retry_on_error = Some(bool_lit(&key, &lit)?),
                "store_result" => attr.store_result = Some(bool_lit(&key, &lit)?),
                "deadline" => attr.deadline_ms = Some(secs_lit(&key, &lit)?),
                "park_fatal" => attr.park_fatal = Some(bool_lit(&key, &lit)?),
                "rate" => {
                    let s = str_lit(&key, &lit)?;
                    let rate = parse_rate(&s.value()).ok_or_else(|| {
                        Error::new_spanned(
                            &lit,
                            "rate is starts per period: \"50/s\", \"300/m\", \"1000/h\" or \"5/10s\"",
                        )
                    })?;
                    attr.rate = Some(rate);
                }
                "rate_key" => attr.rate_key = Some(str_lit(&key, &lit)?),
                "unique_for" => attr.unique_for_ms = Some(secs_lit(&key, &lit)?),
                "concurrency" => {
                    let n = match &lit {
                        Lit::Int(i) => i.base10_parse::<u32>()?,
                        _ => {
                            return Err(Error::new_spanned(
                                &lit,
                                "concurrency takes a whole number of runs",
                            ))
                        }
                    };
                    if n == 0 {
                        return Err(Error::new_spanned(&lit, "concurrency is 1 or more"));
                    }
                    attr.concurrency = Some(n);
                }
                "concurrency_key" => attr.concurrency_key = Some(str_lit(&key, &lit)?),
                "dedup" => {
                    let s = str_lit(&key, &lit)?;
                    if !["active", "window", "debounce"].contains(&s.value().as_str()) {
                        return Err(Error::new_spanned(
                            &lit,
                            "dedup is \"active\" (while queued or running), \"window\" or \"debounce\" (runs once the key is quiet, with the latest arguments)",
                        ));
                    }
                    attr.dedup = Some(s);
                }
                "dedup_key" => attr.dedup_key = Some(str_lit(&key, &lit)?),
                "schedule" => {
                    let s = str_lit(&key, &lit)?;
                    // Checked here, so a typo fails the build at the task rather than the
                    // start of a scheduling worker.
                    if let Err(e) = ferriq_cron::Cron::parse(&s.value()) {
                        return Err(Error::new_spanned(&lit, e.to_string()));
                    }
                    attr.schedule = Some(s);
                }
                "timezone" => attr.timezone = Some(str_lit(&key, &lit)?),
                "schedule_args" => attr.schedule_args = Some(str_lit(&key, &lit)?),
                "no_overlap" => attr.no_overlap = Some(bool_lit(&key, &lit)?),
                "inventory" => attr.inventory = Some(bool_lit(&key, &lit)?),
                "every" => {
                    let n = match &lit {
                        Lit::Int(i) => i.base10_parse::<u64>()?,
                        _ => return Err(Error::new_spanned(&lit, "every takes whole seconds")),
                    };
                    if n == 0 {
                        return Err(Error::new_spanned(&lit, "every takes at least 1 second"));
                    }
                    attr.every = Some(n);
                }
                "catch_up_max" => {
                    attr.catch_up_max = Some(match &lit {
                        Lit::Int(i) => i.base10_parse::<u32>()?,
                        _ => {
                            return Err(Error::new_spanned(
                                &lit,
                                "catch_up_max takes a whole number",
                            ))
                        }
                    })
                }
                "missed" => {
                    let s = str_lit(&key, &lit)?;
                    if !["skip", "latest", "catch_up"].contains(&s.value().as_str()) {
                        return Err(Error::new_spanned(
                            &lit,
                            "missed is \"skip\", \"latest\" or \"catch_up\"",
                        ));
                    }
                    attr.missed = Some(s);
                }
                _ => {
                    return Err(Error::new_spanned(
                        &item.path,
                        format!("unknown option `{key}`; expected one of: {KNOWN}"),
                    ))
                }
            }
        }
        let scheduled = attr.schedule.is_some() || attr.every.is_some();
        if attr.schedule.is_some() && attr.every.is_some() {
            return Err(Error::new(
                proc_macro2::Span::call_site(),
                "give `schedule` (cron) or `every` (seconds), not both",
            ));
        }
        let needs_schedule = [
            ("timezone", attr.timezone.is_some()),
            ("missed", attr.missed.is_some()),
            ("catch_up_max", attr.catch_up_max.is_some()),
            ("no_overlap", attr.no_overlap.is_some()),
            ("schedule_args", attr.schedule_args.is_some()),
        ];
        if let Some((option, _)) = needs_schedule.iter().find(|(_, set)| *set && !scheduled) {
            return Err(Error::new(
                proc_macro2::Span::call_site(),
                format!(
                    "`{option}` applies to a scheduled task: add `schedule = \"…\"` or `every = N`"
                ),
            ));
        }
        if attr.dedup.is_some() && attr.unique_for_ms.is_none() {
            return Err(Error::new(
                proc_macro2::Span::call_site(),
                "`dedup` says how `unique_for` keeps its key: add `unique_for = SECS`",
            ));
        }
        if attr.dedup_key.is_some() && attr.unique_for_ms.is_none() {
            return Err(Error::new(
                proc_macro2::Span::call_site(),
                "`dedup_key` names the key `unique_for` keeps: add `unique_for = SECS`",
            ));
        }
        if attr.concurrency_key.is_some() && attr.concurrency.is_none() {
            return Err(Error::new(
                proc_macro2::Span::call_site(),
                "`concurrency_key` names the key of a concurrency limit: add `concurrency = N`",
            ));
        }
        if attr.rate_key.is_some() && attr.rate.is_none() {
            return Err(Error::new(
                proc_macro2::Span::call_site(),
                "`rate_key` names the key of a rate limit: add `rate = \"50/s\"`",
            ));
        }
        if attr.timezone.is_some() && attr.every.is_some() {
            return Err(Error::new(
                proc_macro2::Span::call_site(),
                "`timezone` applies to a cron `schedule`, not to `every`",
            ));
        }
        Ok(attr)
    }
}

impl TaskAttr {
    /// A `const` expression building the `TaskOptions`; `args` are the task's argument names
    /// (a `rate_key` naming one reads the key from that argument, else from a label).
    pub(crate) fn options_expr(&self, args: &[String]) -> TokenStream2 {
        let mut e = quote!(::ferriq::TaskOptions::new());
        if let Some(n) = self.max_attempts {
            e = quote!(#e.max_attempts(#n));
        }
        if let Some(ms) = self.timeout_ms {
            e = quote!(#e.timeout(::core::time::Duration::from_millis(#ms)));
        }
        if let Some(q) = &self.queue {
            e = quote!(#e.queue(#q));
        }
        if let Some(ms) = self.backoff_initial_ms {
            e = quote!(#e.backoff_initial(::core::time::Duration::from_millis(#ms)));
        }
        if let Some(ms) = self.backoff_max_ms {
            e = quote!(#e.backoff_max(::core::time::Duration::from_millis(#ms)));
        }
        if let Some(b) = self.retry_on_error {
            e = quote!(#e.retry_on_error(#b));
        }
        if let Some(b) = self.store_result {
            e = quote!(#e.store_result(#b));
        }
        if let Some(ms) = self.deadline_ms {
            e = quote!(#e.deadline(::core::time::Duration::from_millis(#ms)));
        }
        if let Some(b) = self.park_fatal {
            e = quote!(#e.park_fatal(#b));
        }
        if let Some((limit, secs)) = self.rate {
            e = quote!(#e.rate(::ferriq::task::Rate::new(#limit, ::core::time::Duration::from_secs(#secs))));
        }
        if let Some(ms) = self.unique_for_ms {
            let mode = match self.dedup.as_ref().map(LitStr::value).as_deref() {
                Some("window") => quote!(::ferriq::task::Dedup::Window),
                Some("debounce") => quote!(::ferriq::task::Dedup::Debounce),
                _ => quote!(::ferriq::task::Dedup::WhileActive),
            };
            e = quote!(#e.unique_for(::core::time::Duration::from_millis(#ms), #mode));
        }
        let source = |key: &LitStr| match args.iter().position(|a| *a == key.value()) {
            Some(position) => quote!(::ferriq::task::KeySource::argument(#key, #position)),
            None => quote!(::ferriq::task::KeySource::label(#key)),
        };
        if let Some(key) = &self.dedup_key {
            let source = source(key);
            e = quote!(#e.dedup_key(#source));
        }
        if let Some(key) = &self.rate_key {
            let source = source(key);
            e = quote!(#e.rate_key(#source));
        }
        if let Some(n) = self.concurrency {
            e = quote!(#e.concurrency(#n));
        }
        if let Some(key) = &self.concurrency_key {
            let source = source(key);
            e = quote!(#e.concurrency_key(#source));
        }
        e
    }
}

impl TaskAttr {
    /// `.with_schedule(…)` on the registration, when the task is scheduled.
    pub(crate) fn schedule_expr(&self) -> TokenStream2 {
        if self.schedule.is_none() && self.every.is_none() {
            return quote!();
        }
        let opt_str = |s: &Option<LitStr>| match s {
            Some(s) => quote!(::core::option::Option::Some(#s)),
            None => quote!(::core::option::Option::None),
        };
        let cron = opt_str(&self.schedule);
        let timezone = opt_str(&self.timezone);
        let every = match self.every {
            Some(n) => quote!(::core::option::Option::Some(#n)),
            None => quote!(::core::option::Option::None),
        };
        let missed = self
            .missed
            .as_ref()
            .map_or_else(|| quote!("latest"), |m| quote!(#m));
        let max = self.catch_up_max.unwrap_or(100);
        let no_overlap = self.no_overlap.unwrap_or(false);
        let args = self
            .schedule_args
            .as_ref()
            .map_or_else(|| quote!("[]"), |a| quote!(#a));
        quote!(.with_schedule(::ferriq::__private::StaticSchedule::new(
            #cron, #every, #timezone, #missed, #max, #no_overlap, #args
        )))
    }
}

fn str_lit(key: &str, lit: &Lit) -> syn::Result<LitStr> {
    match lit {
        Lit::Str(s) => Ok(s.clone()),
        _ => Err(Error::new_spanned(
            lit,
            format!("option `{key}` takes a string"),
        )),
    }
}

fn bool_lit(key: &str, lit: &Lit) -> syn::Result<bool> {
    match lit {
        Lit::Bool(b) => Ok(b.value),
        _ => Err(Error::new_spanned(
            lit,
            format!("option `{key}` takes `true` or `false`"),
        )),
    }
}

/// Seconds (int or float) as whole milliseconds.
fn secs_lit(key: &str, lit: &Lit) -> syn::Result<u64> {
    let secs = match lit {
        Lit::Int(i) => i.base10_parse::<f64>()?,
        Lit::Float(f) => f.base10_parse::<f64>()?,
        _ => {
            return Err(Error::new_spanned(
                lit,
                format!("option `{key}` takes seconds (a number)"),
            ))
        }
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 14.0 * 86_400.0 {
        return Err(Error::new_spanned(
            lit,
            format!("option `{key}` must be between 0 and 14 days, in seconds"),
        ));
    }
    Ok((secs * 1000.0).round().max(1.0) as u64)
}

/// `N/s`, `N/m`, `N/h` or `N/<count><unit>`: starts allowed and the period in seconds (the same
/// form `ferriq::task::Rate::parse` reads at run time).
fn parse_rate(text: &str) -> Option<(u32, u64)> {
    let (limit, per) = text.trim().split_once('/')?;
    let limit: u32 = limit.trim().parse().ok().filter(|n| *n > 0)?;
    let per = per.trim();
    let unit_at = per.find(|c: char| !c.is_ascii_digit())?;
    let count: u64 = match &per[..unit_at] {
        "" => 1,
        digits => digits.parse().ok().filter(|n| *n > 0)?,
    };
    let unit = match &per[unit_at..] {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return None,
    };
    Some((limit, count * unit))
}

//! The sign-in form: a read token, posted once, in exchange for a session
//! cookie. The token field is a password field, so browsers do not show
//! or keep it in clear.
use crate::http::html::{self, Header, Nav, esc};

pub fn render(next: &str, refused: Option<&str>) -> String {
    let mut body = String::new();
    if let Some(why) = refused {
        body.push_str(&format!("<p class=\"notice refused\" id=\"refused\">Sign-in refused: {}</p>", esc(why)));
    }
    body.push_str(&format!(
        "<form class=\"login\" method=\"post\" action=\"/login\"><input type=\"hidden\" name=\"next\" value=\"{}\">\
         <input type=\"text\" name=\"username\" value=\"sqlbee\" autocomplete=\"username\" hidden>\
         <label>Read token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus required></label>\
         <button type=\"submit\">Sign in</button></form>\
         <p class=\"hint\">A token from the collector's tokens file with the <code>read</code> (or <code>both</code>) role.</p>",
        esc(next)
    ));
    html::page(
        &Header {
            title: "Sign in",
            nav: Nav::Login,
            path: "/login",
            view: None,
            instances: &[],
            keep: &[],
            signed_in: false,
        },
        &body,
    )
}

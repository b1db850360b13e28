#!/usr/bin/env python3
"""Drives the console in a real browser (headless Debian chromium through Selenium).

Logs in with the admin token, finds the call waiting for approval with its arguments and
the middleware that asked, approves it with a reason, and follows the call's page until it
succeeded and its timeline shows the assignment, the approval and the outcome.

Usage: test_console.py --url http://HOST:PORT --token TOKEN --call-id ID
                       --middleware NAME --arg TEXT --reason TEXT
Exit 0: every check passed; 1: a check failed; 77: cannot run here (no selenium, chromium
or chromedriver), which the Rust test turns into a skip, or a failure under CI=true.
Selenium is given /usr/bin/chromedriver explicitly, so it never downloads a driver.
"""

import argparse
import os
import sys
import time

CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_CANDIDATES = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]


def cannot_run(why):
    print(why, file=sys.stderr)
    sys.exit(77)


def fail(why, driver=None):
    print(f"FAILED: {why}", file=sys.stderr)
    if driver is not None:
        print(f"at {driver.current_url}:\n{driver.page_source}", file=sys.stderr)
    sys.exit(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--call-id", required=True)
    parser.add_argument("--middleware", required=True)
    parser.add_argument("--arg", required=True)
    parser.add_argument("--reason", required=True)
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args()

    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
    except ImportError as error:
        cannot_run(f"python selenium is not installed ({error}); pip install selenium")
    chromium = next((c for c in CHROMIUM_CANDIDATES if os.access(c, os.X_OK)), None)
    if chromium is None:
        cannot_run("chromium is not installed (apt-get install chromium)")
    if not os.access(CHROMEDRIVER, os.X_OK):
        cannot_run(f"{CHROMEDRIVER} is missing (apt-get install chromium-driver)")

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--disable-gpu", "--window-size=1280,1000"]:
        options.add_argument(flag)
    # A fixed driver path: Selenium Manager is never asked to download anything.
    service = Service(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(60)
    try:
        run(driver, By, args)
    finally:
        driver.quit()
    print("console checks passed")


def wait_for(driver, what, check, timeout, refresh=False):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:  # an element not there yet
            pass
        if time.monotonic() > deadline:
            fail(f"timed out waiting for {what}", driver)
        time.sleep(0.3)
        if refresh:
            driver.refresh()


def run(driver, By, args):
    base = args.url.rstrip("/")
    call_id = args.call_id

    # Unauthenticated: the console sends the browser to the login form.
    driver.get(base + "/ui")
    if not driver.current_url.endswith("/ui/login"):
        fail("an unauthenticated /ui did not lead to the login form", driver)

    # A wrong token is refused, and shows no data.
    driver.find_element(By.ID, "token").send_keys("not-a-token")
    driver.find_element(By.ID, "login").click()
    # A click does not wait for the next page: wait for what it should show.
    wait_for(driver, "the login form's message",
             lambda: driver.find_element(By.ID, "message"), 30)
    message = driver.find_element(By.ID, "message").text
    if "unauthenticated" not in message:
        fail(f"a wrong token was not refused as unauthenticated: {message!r}", driver)
    if driver.find_elements(By.ID, "awaiting"):
        fail("a wrong token showed the calls awaiting approval", driver)

    # Log in with the admin token.
    driver.find_element(By.ID, "token").send_keys(args.token)
    driver.find_element(By.ID, "login").click()
    wait_for(driver, "logging in to lead to /ui",
             lambda: driver.current_url.endswith("/ui")
             and driver.find_elements(By.ID, "who"), 30)
    if "operator:" not in driver.find_element(By.ID, "who").text:
        fail("the header does not name the operator", driver)
    cookies = {c["name"]: c for c in driver.get_cookies()}
    session = cookies.get("toolgrid_console")
    if session is None or not session.get("httpOnly") or session.get("sameSite") != "Strict":
        fail(f"the session cookie is not HttpOnly and SameSite=Strict: {session}")

    # The waiting call, its arguments and the middleware that asked.
    row_id = f"call-{call_id}"
    wait_for(driver, "the call in the approval list",
             lambda: driver.find_element(By.ID, row_id), args.timeout, refresh=True)
    row = driver.find_element(By.ID, row_id)
    if args.arg not in row.text:
        fail(f"the call's row does not show its argument {args.arg!r}: {row.text!r}", driver)
    middleware = row.find_element(By.CLASS_NAME, "middleware").text
    if middleware != args.middleware:
        fail(f"the row names middleware {middleware!r}, not {args.middleware!r}", driver)

    # Approve it with a reason.
    row.find_element(By.ID, f"approve-reason-{call_id}").send_keys(args.reason)
    row.find_element(By.ID, f"approve-{call_id}").click()
    wait_for(driver, "approving to lead to the call's page",
             lambda: driver.current_url.endswith(f"/ui/calls/{call_id}")
             and driver.find_elements(By.ID, "timeline"), 30)
    if driver.find_elements(By.ID, "message"):
        fail(f"approving failed: {driver.find_element(By.ID, 'message').text}", driver)

    # The call runs and succeeds; its timeline tells the story.
    wait_for(driver, "the call to succeed",
             lambda: driver.find_element(By.ID, "state").text == "succeeded",
             args.timeout, refresh=True)
    entries = driver.find_elements(By.CSS_SELECTOR, "#timeline tr.entry")
    kinds = [e.get_attribute("data-kind") for e in entries]
    for kind in ["assigned", "approval", "outcome"]:
        if kind not in kinds:
            fail(f"the timeline has no {kind} entry: {kinds}", driver)
    if kinds.index("approval") > kinds.index("assigned"):
        fail(f"the approval should come before the assignment: {kinds}", driver)
    approval = entries[kinds.index("approval")].text
    if args.reason not in approval or "approved by operator:" not in approval:
        fail(f"the approval entry does not say who approved and why: {approval!r}", driver)
    outcome = entries[kinds.index("outcome")].text
    if "succeeded" not in outcome:
        fail(f"the outcome entry does not say succeeded: {outcome!r}", driver)

    # The list no longer offers it, and logging out ends the session.
    driver.get(base + "/ui")
    if driver.find_elements(By.ID, row_id):
        fail("a decided call is still listed as awaiting approval", driver)
    driver.find_element(By.ID, "logout").click()
    wait_for(driver, "logging out to lead to the login form",
             lambda: driver.current_url.endswith("/ui/login")
             and driver.find_elements(By.ID, "token"), 30)
    driver.get(base + f"/ui/calls/{call_id}")
    if not driver.current_url.endswith("/ui/login"):
        fail("after logging out, a call page was still shown", driver)


if __name__ == "__main__":
    main()

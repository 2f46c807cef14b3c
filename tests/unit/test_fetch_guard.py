"""fetch.py's address guard and redirect rules, against real local servers and a patched resolver."""

import socket

import pytest

from agentflow.domain.deadline import Deadline
from agentflow.tools.fetch import AddressGuard, Fetcher, FetchError, _retry_after
from tests.standins.web import PageServer

REFUSED = ["10.0.0.1", "172.16.5.4", "192.168.1.1", "127.0.0.1", "169.254.169.254", "224.0.0.1", "0.0.0.0",
           "240.0.0.1", "255.255.255.255", "100.64.0.1", "::1", "::", "fe80::1", "fc00::1", "ff02::1",
           "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254", "fe80::1%eth0"]
ACCEPTED = ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused(address):
    assert AddressGuard().refusal(address)


@pytest.mark.parametrize("address", ACCEPTED)
def test_public_addresses_pass(address):
    assert AddressGuard().refusal(address) is None


def test_the_reason_names_the_kind_of_address():
    guard = AddressGuard()
    assert guard.refusal("127.0.0.1") == "loopback"
    assert guard.refusal("169.254.169.254") == "link-local"
    assert guard.refusal("::ffff:10.0.0.1") == "private"


@pytest.mark.parametrize("host", ["2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1", "localhost",
                                  "::ffff:127.0.0.1", "::1"])
def test_host_spellings_are_judged_on_what_they_resolve_to(host):
    with pytest.raises(FetchError) as err:
        AddressGuard().resolve(host, 80)
    assert err.value.kind == "forbidden"


def test_allowed_networks_let_only_those_through():
    guard = AddressGuard(allowed_networks=["127.0.0.0/8"])
    assert guard.refusal("127.0.0.1") is None and guard.refusal("::ffff:127.0.0.2") is None
    assert guard.refusal("10.0.0.1") == "private" and guard.refusal("::1") == "loopback"
    assert AddressGuard(allow_private=True).refusal("169.254.169.254") is None


def test_a_name_resolving_to_any_private_address_is_refused(monkeypatch):
    def fake(host, port, *args, **kwargs):
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.7", port))]
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(FetchError, match=r"^forbidden: public\.example resolves to 10\.0\.0\.7, a private"):
        AddressGuard().resolve("public.example", 443)


def test_guarded_fetcher_never_connects_to_a_refused_address():
    with PageServer({"/": (200, "text/html", "<p>hi</p>")}) as server:
        with pytest.raises(FetchError) as err:
            Fetcher(guard=AddressGuard()).get(server.url("/"), Deadline(5))
        assert err.value.kind == "forbidden" and server.count == 0
        allowed = Fetcher(guard=AddressGuard(allowed_networks=["127.0.0.0/8"])).get(server.url("/"), Deadline(5))
        assert allowed.status == 200 and allowed.content_type == "text/html" and server.count == 1


def test_redirect_to_a_private_address_is_refused_even_when_loopback_is_allowed():
    with PageServer({"/": (302, "", "http://10.0.0.1/latest/meta-data/")}) as server:
        fetcher = Fetcher(guard=AddressGuard(allowed_networks=["127.0.0.0/8"]))
        with pytest.raises(FetchError, match="^forbidden: 10.0.0.1"):
            fetcher.get(server.url("/"), Deadline(5))
        assert server.count == 1


def test_redirects_are_followed_at_most_five_times_and_only_to_http():
    pages = {f"/{n}": (302, "", f"/{n + 1}") for n in range(7)}
    pages["/ftp"] = (301, "", "ftp://example.org/file")
    pages["/6"] = (200, "text/plain", "end")
    with PageServer(pages) as server:
        fetcher = Fetcher(guard=AddressGuard(allowed_networks=["127.0.0.0/8"]))
        assert fetcher.get(server.url("/1"), Deadline(5)).text() == "end"
        with pytest.raises(FetchError, match="^bad_response: more than 5 redirects"):
            fetcher.get(server.url("/0"), Deadline(5))
        with pytest.raises(FetchError, match="^forbidden: only http and https"):
            fetcher.get(server.url("/ftp"), Deadline(5))


@pytest.mark.parametrize("url", ["http://[::1", "http://[::1/x", "http://exa mple.com/", "http://a.example/\r\nX: y",
                                 "http://a.example/\x00", "http://\u2028a.example/", "http://a.example:99999/",
                                 "http://a.example:port/", 42, None])
def test_a_malformed_url_is_an_invalid_input_error(url):
    with pytest.raises(FetchError, match="^invalid_input: malformed URL"):
        Fetcher(attempts=1).get(url, Deadline(5))


def test_retry_after_takes_seconds_or_a_date():
    assert _retry_after("3", 0.5) == 3.0
    assert _retry_after(None, 0.5) == 0.5 and _retry_after("soon", 0.5) == 0.5
    assert _retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 0.5) == 0.0

"""S3 credentials through the standard AWS chain, built from minio's own providers (``minio.credentials``):

1. **environment**: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``), minio's
   ``EnvAWSProvider``; in the cluster the optional S3 Secret fills them in;
2. **profile**: ``[$AWS_PROFILE]`` (else ``[default]``) of ``$AWS_SHARED_CREDENTIALS_FILE`` (else
   ``~/.aws/credentials``), minio's ``AWSConfigProvider``;
3. **web identity token** (EKS IRSA: ``AWS_WEB_IDENTITY_TOKEN_FILE`` + ``AWS_ROLE_ARN``, exchanged at STS, at
   ``$AWS_ENDPOINT_URL_STS`` if set), **container credentials** (``AWS_CONTAINER_CREDENTIALS_*_URI``) or else the
   **instance role** (IMDS at 169.254.169.254): minio's ``IamAwsProvider``, which picks one of these by the
   environment, given a client with a 1 s connect timeout and no retries (minio's own default has no timeout and
   5 retries, so a machine without IMDS would wait). ``AWS_EC2_METADATA_DISABLED=true`` (botocore's switch) leaves
   IMDS out; the test suite sets it, so no test reaches a non-loopback address.

The first link that yields keys is used (minio's ``ChainedProvider``, which asks it again when temporary credentials
expire). When none does, :class:`~fourm_kfp.storage.base.StorageError` names each link and why it found nothing.
Keys are never logged; a reason keeps no URL query string (the web identity token travels in one).
"""

from __future__ import annotations

import os
import re

from fourm_kfp.storage.base import StorageError

#: botocore's switch that leaves the instance metadata service (IMDS) out of the chain.
IMDS_DISABLED_ENV = "AWS_EC2_METADATA_DISABLED"


def _imds_disabled() -> bool:
    return os.environ.get(IMDS_DISABLED_ENV, "").strip().lower() in ("true", "1", "yes")


def _without_query(text: str) -> str:
    return re.sub(r"\?\S*", "?…", text)


def _iam_link_name() -> str:
    if os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return "web identity token ($AWS_WEB_IDENTITY_TOKEN_FILE, $AWS_ROLE_ARN)"
    if os.environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") or os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        return "container credentials ($AWS_CONTAINER_CREDENTIALS_*_URI)"
    return "instance role (IMDS)"


def _link_class():
    from minio.credentials.providers import Provider

    class NamedLink(Provider):
        """One link of the chain, named; remembers why it found nothing and turns a network error into the
        ``ValueError`` on which minio's ``ChainedProvider`` moves on."""

        def __init__(self, name: str, provider, skipped_because: str = ""):
            self.name, self.provider, self.reason, self.found = name, provider, skipped_because, False

        def retrieve(self):
            import urllib3

            if self.provider is None:
                raise ValueError(self.reason)
            try:
                credentials = self.provider.retrieve()
            except ValueError as exc:
                self.reason = _without_query(str(exc))
                raise
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                self.reason = f"unreachable ({type(exc).__name__})"
                raise ValueError(self.reason) from exc
            self.found = True
            return credentials

    return NamedLink


def _iam_http_client():
    import certifi
    import urllib3

    return urllib3.PoolManager(timeout=urllib3.Timeout(connect=1.0, read=5.0),
                               retries=urllib3.Retry(total=0, redirect=0, raise_on_status=False),
                               cert_reqs="CERT_REQUIRED", ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where())


def _links() -> list:
    from minio.credentials import AWSConfigProvider, EnvAWSProvider, IamAwsProvider

    NamedLink = _link_class()
    has_id, has_secret = bool(os.environ.get("AWS_ACCESS_KEY_ID")), bool(os.environ.get("AWS_SECRET_ACCESS_KEY"))
    if has_id != has_secret:
        raise StorageError("S3 credentials incomplete: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set "
                           f"together ({'AWS_SECRET_ACCESS_KEY' if has_id else 'AWS_ACCESS_KEY_ID'} is not)")
    env = NamedLink("environment ($AWS_ACCESS_KEY_ID, $AWS_SECRET_ACCESS_KEY)",
                    EnvAWSProvider() if has_id else None, "not set")
    profile = NamedLink(f"profile [{os.environ.get('AWS_PROFILE') or 'default'}] of "
                        f"{os.environ.get('AWS_SHARED_CREDENTIALS_FILE') or '~/.aws/credentials'}",
                        AWSConfigProvider())
    iam_name = _iam_link_name()
    if iam_name.startswith("instance role") and _imds_disabled():
        iam = NamedLink(iam_name, None, f"${IMDS_DISABLED_ENV} is set")
    else:
        iam = NamedLink(iam_name, IamAwsProvider(http_client=_iam_http_client(),
                                                 custom_endpoint=os.environ.get("AWS_ENDPOINT_URL_STS") or None))
    return [env, profile, iam]


def credential_chain():
    """``(provider, source)``: the chain as a minio credentials provider whose keys were found, and the name of the
    link that found them. A first ``retrieve`` is made here, so a machine without credentials is told at once, not
    at its first request: :class:`StorageError` naming each link tried and why it found nothing."""
    from minio.credentials import ChainedProvider

    links = _links()
    chain = ChainedProvider(links)
    try:
        chain.retrieve()
    except ValueError:
        tried = "; ".join(f"{link.name}: {link.reason or 'no keys'}" for link in links)
        raise StorageError(f"no S3 credentials found; tried {tried}") from None
    source = next(link.name for link in links if link.found)
    return chain, source

"""Search-v0: the built-in QA set, BM25 over files and local datasets, a real HTTP service."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

import agentgym
from agentgym import ConfigError
from agentgym._tasks import load_tasks
from agentgym.envs.search import exact_match, final_answer, normalize, token_f1
from agentgym.envs.search.backends import BM25Backend, Doc, bm25_from
from agentgym.envs.search.tasks import make_tasks, qa_index
from tests.conftest import hermes_call as call
from tests.conftest import require, send_json, serve_in_thread

CORPUS = [
    {"pid": "p1", "heading": "Lima", "body": "Lima is the capital of Peru, on the Pacific coast."},
    {"pid": "p2", "heading": "Paris", "body": "Paris is the capital of France, on the Seine."},
    {"pid": "p3", "heading": "Oslo", "body": "Oslo is the capital of Norway, at a fjord."},
]
FIELDS = {"id": "pid", "title": "heading", "text": "body"}
QUESTIONS = [
    {"question": "Which river runs through the capital of France?", "answer": "the Seine",
     "doc_id": "p2"},
    {"question": "Of which country is Lima the capital?", "answer": ["Peru", "Republic of Peru"],
     "doc_id": "p1"},
]  # fmt: skip


@pytest.fixture(autouse=True)
def _bm25s() -> None:
    require("bm25s")  # every index here is a bm25s one


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def reference(env_id: str = "search", **kwargs) -> agentgym.ScriptedPolicy:
    return agentgym.ScriptedPolicy(agentgym.make(env_id, **kwargs).reference_turns)


# --- the built-in QA set ---------------------------------------------------------------------


def test_no_guess_without_a_search_answers_many_builtin_questions():
    """The best fixed answer per kind of question (answer `0` to every default value ...)."""
    from collections import Counter

    tasks = make_tasks()
    by_kind = {k: Counter(t["answer"] for t in tasks if t["kind"] == k)
               for k in ("name", "parameter", "default")}  # fmt: skip
    assert max(n for counts in by_kind.values() for n in counts.values()) <= 3
    guessed = sum(counts.most_common(1)[0][1] for counts in by_kind.values())
    assert guessed / len(tasks) < 0.02  # 29 of 447 (6.5%) before the cap


def test_builtin_answers_are_in_their_document_and_found_by_search():
    tasks, index = make_tasks(), qa_index()
    assert len(tasks) > 400 and {t["kind"] for t in tasks} == {"name", "parameter", "default"}
    for task in tasks:
        assert normalize(task["answer"]) in normalize(index.open(task["doc_id"]).text), task
    top5 = sum(t["doc_id"] in [h.id for h in index.search(t["question"], 5)] for t in tasks)
    assert top5 / len(tasks) > 0.95


def test_builtin_split_holds_out_whole_documents_the_same_way_each_time():
    train = agentgym.make("search").tasks
    held = agentgym.make("search", split="eval").tasks
    assert len(held) > 50 and len(train) > 3 * len(held)
    assert not {t["doc_id"] for t in train} & {t["doc_id"] for t in held}
    assert agentgym.make("search", split="eval").tasks == held
    assert agentgym.make("search", split="eval", split_seed=1).tasks != held


def test_reference_episodes_score_one_on_both_splits():
    for split in ("train", "eval"):
        trajectories = agentgym.rollout(
            "search", reference(split=split), num_tasks=25, env_kwargs={"split": split}
        )
        assert [(t.status, t.final_reward) for t in trajectories] == [("ok", 1.0)] * 25
        assert trajectories[0].scores["token_f1"] == 1.0
        tools = [m["name"] for m in trajectories[0].messages if m["role"] == "tool"]
        assert tools == ["search", "open"]


# --- rewards ---------------------------------------------------------------------------------


def test_final_answer_takes_the_last_answer_line():
    assert final_answer("I think...\nAnswer: math.gcd\nthanks") == "math.gcd"
    assert final_answer("Answer: 1\nanswer:  2") == "2"  # a second guess replaces the first
    assert final_answer("just Peru") == "just Peru"


def test_exact_match_normalises_like_squad_and_f1_is_partial():
    assert normalize("The  Seine!") == "seine"
    assert exact_match("Answer: the Seine.", "Seine") == 1.0
    assert exact_match("Answer: Seine river", "Seine") == 0.0
    assert exact_match("Answer: republic of peru", ["Peru", "Republic of Peru"]) == 1.0
    assert exact_match("Answer: Peru or France", ["Peru"]) == 0.0
    assert token_f1("Answer: Seine river", "Seine") == pytest.approx(2 / 3)
    assert token_f1("Answer: nothing", "Seine") == 0.0


def test_f1_can_be_the_reward():
    env = agentgym.make("search", corpus=CORPUS, tasks=QUESTIONS, fields=FIELDS, reward="f1")
    [trajectory] = agentgym.rollout(
        lambda: env, agentgym.ScriptedPolicy(["Answer: Seine river"]), tasks=[0]
    )
    assert trajectory.final_reward == pytest.approx(2 / 3)
    assert trajectory.scores["exact_match"] == 0.0


# --- corpora of your own ---------------------------------------------------------------------


def test_jsonl_corpus_with_named_columns(tmp_path: Path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    tasks = write_jsonl(tmp_path / "qa.jsonl", QUESTIONS)
    kwargs = {"corpus": str(corpus), "tasks": str(tasks), "fields": FIELDS, "split": "all"}
    env = agentgym.make("search", **kwargs)
    assert env.backend.search("capital Norway", 2)[0].id == "p3"
    trajectories = agentgym.rollout("search", reference(**kwargs), env_kwargs=kwargs)
    assert [t.final_reward for t in trajectories] == [1.0, 1.0]
    assert "[p2] Paris" in trajectories[0].messages[3]["content"]
    assert trajectories[0].messages[5]["content"].startswith("Paris\n\nParis is the capital")


def test_corpus_file_is_indexed_once_per_process_until_it_changes(tmp_path: Path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", CORPUS)
    first = bm25_from(corpus, FIELDS)
    assert bm25_from(str(corpus), FIELDS) is first
    write_jsonl(corpus, CORPUS[:2])
    assert len(bm25_from(corpus, FIELDS).docs) == 2


def test_saved_hf_dataset_as_corpus_and_tasks(tmp_path: Path):
    datasets = require("datasets")
    datasets.Dataset.from_list(CORPUS).save_to_disk(str(tmp_path / "corpus"))
    datasets.DatasetDict({"test": datasets.Dataset.from_list(QUESTIONS[:1])}).save_to_disk(
        str(tmp_path / "qa")
    )
    env = agentgym.make(
        "search", corpus=str(tmp_path / "corpus"), fields=FIELDS, split="all",
        tasks=load_tasks(tmp_path / "qa", hf_split="test"),
    )  # fmt: skip
    [trajectory] = agentgym.rollout(lambda: env, agentgym.ScriptedPolicy(env.reference_turns))
    assert trajectory.final_reward == 1.0


def test_model_mistakes_go_back_to_the_model():
    env = agentgym.make("search", corpus=CORPUS, tasks=QUESTIONS, fields=FIELDS, split="all")
    turns = [call("open", doc_id="p9"), call("search", query="Peru", k=50), "Answer: Peru"]
    [trajectory] = agentgym.rollout(lambda: env, agentgym.ScriptedPolicy(turns), tasks=[1])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0
    assert "no document with id 'p9'" in trajectory.messages[3]["content"]
    assert "k must be between 1 and 10" in trajectory.messages[5]["content"]
    assert all(t.tool_errors for t in trajectory.turns[:2])


def test_bad_configuration_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="needs tasks="):
        agentgym.make("search", corpus=CORPUS, fields=FIELDS)
    with pytest.raises(ConfigError, match="'question'.*'answer'"):
        agentgym.make("search", corpus=CORPUS, fields=FIELDS, tasks=[{"prompt": "q"}])
    with pytest.raises(ConfigError, match="no 'body' column"):
        agentgym.make("search", corpus=[{"pid": "x"}], fields=FIELDS, tasks=QUESTIONS)
    with pytest.raises(ConfigError, match="ids must be unique"):
        BM25Backend([Doc("a", "", "x"), Doc("a", "", "y")])
    with pytest.raises(ConfigError, match="no corpus file"):
        agentgym.make("search", corpus=str(tmp_path / "nope.jsonl"), tasks=QUESTIONS)
    with pytest.raises(ConfigError, match="drop it for a service"):
        agentgym.make("search", corpus="http://127.0.0.1:9", fields=FIELDS, tasks=QUESTIONS)
    with pytest.raises(ConfigError, match="input should be 'exact_match' or 'f1'"):
        agentgym.make("search", reward="bleu")


# --- a real search service over HTTP ---------------------------------------------------------


class SearchService(BaseHTTPRequestHandler):
    """The REST contract of `agentgym.envs.search.backends`, over a BM25 index."""

    backend: BM25Backend
    broken = threading.Event()  # set: every request answers 500

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if self.broken.is_set():
            return self._send(500, {"detail": "index unavailable"})
        if url.path == "/":  # a landing page, as real services have: not JSON
            return self._send_html()
        if url.path == "/search":
            query = parse_qs(url.query)
            if "((" in query["q"][0]:  # a query the service cannot parse
                return self._send(400, {"detail": "unbalanced parentheses"})
            hits = self.backend.search(query["q"][0], int(query["k"][0]))
            return self._send(200, {"hits": [h.__dict__ for h in hits]})
        doc = self.backend.docs.get(unquote(url.path.removeprefix("/docs/")))
        if doc is None:
            return self._send(404, {"detail": "no such document"})
        self._send(200, doc.__dict__)

    def _send(self, status: int, body: dict) -> None:
        send_json(self, status, body)

    def _send_html(self) -> None:
        data = b"<html>search service</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@pytest.fixture
def service() -> Iterator[tuple[str, ThreadingHTTPServer]]:
    SearchService.backend = BM25Backend([Doc(r["pid"], r["heading"], r["body"]) for r in CORPUS])
    server = ThreadingHTTPServer(("127.0.0.1", 0), SearchService)
    thread = serve_in_thread(server)
    SearchService.broken.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}", server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_http_backend_plays_reference_episodes(service):
    url, _ = service
    kwargs = {"corpus": url, "tasks": QUESTIONS, "split": "all"}
    trajectories = agentgym.rollout("search", reference(**kwargs), env_kwargs=kwargs)
    assert [(t.status, t.final_reward) for t in trajectories] == [("ok", 1.0)] * 2
    assert "[p2] Paris" in trajectories[0].messages[3]["content"]


def test_http_unknown_doc_is_the_models_mistake(service):
    url, _ = service
    env = agentgym.make("search", corpus=url, tasks=QUESTIONS, split="all")
    turns = [call("open", doc_id="../p9?x=1"), "Answer: Peru"]
    [trajectory] = agentgym.rollout(lambda: env, agentgym.ScriptedPolicy(turns), tasks=[1])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0
    assert "no document with id '../p9?x=1'" in trajectory.messages[3]["content"]


def test_requests_the_service_refuses_are_the_models_mistake_not_infra_error(service):
    # ".." left /docs/ (GET / answered a landing page: InfraError), and a 400 was InfraError
    # too: a policy could turn an episode it was failing into an unscored infra_error
    url, _ = service
    env = agentgym.make("search", corpus=url, tasks=QUESTIONS, split="all")
    turns = [call("open", doc_id=".."), call("open", doc_id="."), call("search", query="((Peru"),
             call("search", query="Peru " * 1000), "Answer: Peru"]  # fmt: skip
    [trajectory] = agentgym.rollout(lambda: env, agentgym.ScriptedPolicy(turns), tasks=[1])
    assert trajectory.status == "ok" and trajectory.final_reward == 1.0
    contents = [m["content"] for m in trajectory.messages if m["role"] == "tool"]
    assert "no document with id '..'" in contents[0] and "no document with id '.'" in contents[1]
    assert "refused this request (400)" in contents[2]
    assert "query longer than 2000" in contents[3]
    assert all(t.tool_errors for t in trajectory.turns[:4])


def test_a_failing_or_dead_service_is_infra_error_not_reward_zero(service):
    url, server = service
    env_kwargs = {"corpus": url, "tasks": QUESTIONS, "split": "all"}
    SearchService.broken.set()
    [broken] = agentgym.rollout("search", reference(**env_kwargs), tasks=[0], env_kwargs=env_kwargs)
    assert broken.status == "infra_error" and broken.final_reward is None
    assert "answered 500" in broken.error
    server.shutdown()
    server.server_close()
    [dead] = agentgym.rollout("search", reference(**env_kwargs), tasks=[0], env_kwargs=env_kwargs)
    assert dead.status == "infra_error" and "ConnectError" in dead.error

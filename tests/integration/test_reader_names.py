"""The names a generated schema refuses because a generated client could not use them
(``bulldozer.schema.reader_names``), checked against the generators themselves: every
refused case, generated with the check left out, fails to build (Java: protoc + javac; Go:
protoc-gen-go + go build) or hides a message's own attribute (Python); a schema of
near-misses, which is accepted, builds in all three and round-trips in Python."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from pydantic import ValidationError
from pyiceberg.schema import Schema
from pyiceberg.types import (
    IcebergType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from bulldozer.codegen.native import (
    GO_PROTOBUF,
    GO_VERSION,
    GRPC_JAVA,
    _protobuf_java,
    client_java_package,
    go_plugins,
    java_protoc,
)
from bulldozer.errors import SchemaError
from bulldozer.schema import compile_proto, generate_proto, iceberg, render_proto
from bulldozer.schema.compile import load_message_classes, protoc_include_dir
from bulldozer.settings import python_command
from bulldozer.spec.models import ProtobufConfig
from tests import jvm
from tests.java_compiler import JavaCompiler
from tests.schemas import spec_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S, L = StringType(), LongType()


def struct(*fields: tuple[str, IcebergType]) -> StructType:
    return StructType(*(NestedField(100 + i, n, t) for i, (n, t) in enumerate(fields)))


#: (columns besides the key ``k``, the language refused for, what the refusal says)
# fmt: off
REFUSED: list[tuple[list[tuple[str, IcebergType]], str, str]] = [
    ([("x", S), ("X", S)], "java", "columns 'x' and 'X' become the same Java constant X_FIELD_NUMBER"),
    ([("_", S)], "java", "column '_' becomes the field _, with no letter or digit"),
    ([("descriptor", S)], "java", "column 'descriptor' becomes the Java accessor getDescriptor()"),
    ([("DefaultInstance", L)], "java", "getDefaultInstance(), which every Java message already has"),
    ([("parent_for_children", S)], "java", "getParentForChildren()"),
    ([("unknown_field_set_builder", S)], "java", "getUnknownFieldSetBuilder()"),
    ([("bit_field0", L)], "java", "column 'bit_field0' becomes the Java field bitField0_"),
    ([("payload", S), ("payload_bytes", L)], "java", "columns 'payload_bytes' and 'payload' become the same Java "
     "accessor getPayloadBytes() (a string field payload has one of that name)"),
    ([("s", struct(("a", S))), ("s_builder", S)], "java", "getSBuilder()"),
    ([("s", struct(("a", S))), ("s_or_builder", S)], "java", "getSOrBuilder()"),
    ([("ts", TimestamptzType()), ("ts_builder", S)], "java", "getTsBuilder()"),
    ([("m", MapType(200, S, 201, L)), ("m_map", S)], "java", "getMMap()"),
    ([("m", MapType(200, S, 201, L)), ("mutable_m", S)], "java", "getMutableM()"),
    ([("items", ListType(200, struct(("a", S)), element_required=True)), ("items_builder_list", S)], "java",
     "getItemsBuilderList()"),
    ([("builder", struct(("a", S)))], "java", "column 'builder' becomes the nested message Builder"),
    ([("builder_parent", struct(("a", S)))], "java", "the nested message BuilderParent"),
    ([("value_message", struct(("a", S)))], "java", "becomes the message ValueMessage.ValueMessage, inside"),
    ([("s", struct(("a", S), ("s", struct(("b", S)))))], "java", "column 's.s' becomes the message ValueMessage.S.S"),
    ([("s", struct(("a", S))), ("s_or_builder", struct(("a", S)))], "java", "the nested messages S and SOrBuilder"),
    ([("DESCRIPTOR", S)], "python", "column 'DESCRIPTOR' becomes the field DESCRIPTOR, which would hide DESCRIPTOR, an attribute"),
    ([("SerializeToString", S)], "python", "would hide SerializeToString, an attribute every Python message has"),
    ([("ListFields", L)], "python", "would hide ListFields"),
    ([("proto_reflect", S)], "go", "column 'proto_reflect' becomes the Go field ProtoReflect"),
]
# fmt: on

#: names next to the refused ones that every generator takes (protoc renames some itself)
NEAR_MISSES: list[tuple[str, IcebergType]] = [
    ("x", S), ("get_x", S), ("a1b", S), ("a1_b", S), ("_x", S), ("has_x", S), ("clear_x", S), ("x_count", L), ("x_list", L),
    ("FOO", S), ("foo_", S), ("descriptor_for_type", S), ("default_instance_for_type", S), ("unknown_fields", S),
    ("serialized_size", L), ("all_fields", S), ("parser_for_type", S), ("memoized_is_initialized", S),
    ("String", S), ("Object", S), ("Integer", L), ("self", S), ("init", S), ("type", S), ("func", S),
    ("bit_field", S), ("ProtoMessage", S), ("Reset", S), ("Descriptor_x", S), ("n", L), ("n_bytes", L),
    ("tags", ListType(300, S, element_required=True)), ("tags_count", L), ("tags_list", L),
    ("m", MapType(301, S, 302, L)), ("m_count", L), ("m_or_default", L),
    ("parser", struct(("a", S))), ("list_fields", struct(("a", S))), ("double_", struct(("a", S))), ("key_message", struct(("v", S))),
    ("s", struct(("a", S), ("builder_x", S), ("x", struct(("y", S))))), ("ts", TimestamptzType()),
]  # fmt: skip


def schema_of(columns: list[tuple[str, IcebergType]]) -> Schema:
    """A key ``k`` and ``columns``; lists and maps not null, so they are repeated and map
    fields (a nullable one is wrapped in a message)."""
    return Schema(
        NestedField(1, "k", L, required=True),
        *(NestedField(2 + i, n, t, required=isinstance(t, ListType | MapType)) for i, (n, t) in enumerate(columns)),
    )


def unchecked_proto(columns: list[tuple[str, IcebergType]], monkeypatch: pytest.MonkeyPatch) -> str:
    """The schema's .proto as it would be without the check (to show what it spares readers)."""
    with monkeypatch.context() as m:
        m.setattr(iceberg, "_check_reader_names", lambda *_, **__: None)
        return render_proto(generate_proto(spec_for(["k"]), schema_of(columns)))


def with_options(text: str, *options: str) -> str:
    """``text`` (a .proto) with these file options."""
    return text.replace('syntax = "proto3";', 'syntax = "proto3";' + "".join(f"\noption {o};" for o in options), 1)


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=600, check=False, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def toolchains(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    for tool in ("javac", "mvn", "go"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is required to check the generated clients (scripts/bootstrap.sh installs it)")
    root = tmp_path_factory.mktemp("readers")
    jar = maven_jar(f"com.google.protobuf:protobuf-java:{_protobuf_java()}", root)
    with JavaCompiler() as javac:  # the module's 45 builds in one JVM
        yield {"jar": jar, "protoc": java_protoc(), "go": go_plugins()[0], "root": root, "javac": javac}


def maven_jar(coordinates: str, folder: Path) -> Path:
    """The jar of ``GROUP:ARTIFACT:VERSION``, fetched by Maven into ``folder``."""
    got = run(
        ["mvn", "-q", "-B", "dependency:copy", f"-Dartifact={coordinates}", f"-DoutputDirectory={folder}"],
        folder,
        jvm.maven_env(),
    )
    assert got.returncode == 0, got.stdout[-2000:]
    _, artifact, version = coordinates.split(":")
    return folder / f"{artifact}-{version}.jar"


def protoc_javac(tools: dict[str, Any], folder: Path, classpath: list[Path]) -> str:
    """protoc's Java for ``folder``/*.proto, built with javac beside ``folder``/src's own
    sources: "" when it builds, else "javac: " and javac's first error ("protoc: ..." when
    protoc itself refused)."""
    (folder / "src").mkdir(parents=True, exist_ok=True)
    protos = [str(p) for p in folder.glob("*.proto")]
    made = run(
        [str(tools["protoc"]), f"-I{folder}", f"-I{protoc_include_dir()}", f"--java_out={folder / 'src'}", *protos],
        folder,
    )
    if made.returncode:
        return "protoc: " + made.stderr
    sources = [str(p) for p in (folder / "src").rglob("*.java")]
    cp = ":".join(str(jar) for jar in classpath)
    code, said = tools["javac"].javac(["-nowarn", "-cp", cp, "-d", str(folder / "classes"), *sources])
    return "" if code == 0 else "javac: " + said.split("error: ", 1)[-1].splitlines()[0]


def java_errors(tools: dict[str, Any], texts: list[str], packages: list[str] | None = None) -> list[str]:
    """For each .proto text: javac's first error on protoc's Java code ("" when it builds),
    in the Java package ``packages[i]`` (default ``p<i>``)."""

    def one(i: int, text: str) -> str:
        package = packages[i] if packages else f"p{i}"
        folder = tools["root"] / f"java{i}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        (folder / "c.proto").write_text(with_options(text, f'java_package = "{package}"', "java_multiple_files = true"))
        return protoc_javac(tools, folder, [tools["jar"]])

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, range(len(texts)), texts))


def go_errors(tools: dict[str, Any], texts: list[str]) -> list[str]:
    """For each .proto text: go build's errors on protoc-gen-go's code ("" when it builds)."""
    module = tools["root"] / "gomod"
    shutil.rmtree(module, ignore_errors=True)
    module.mkdir()
    (module / "go.mod").write_text(
        f"module readers\n\ngo {GO_VERSION}\n\nrequire google.golang.org/protobuf {GO_PROTOBUF}\n"
    )
    for i, text in enumerate(texts):
        (module / f"c{i}.proto").write_text(with_options(text, f'go_package = "readers/p{i}"'))
        made = run([*python_command("-m", "grpc_tools.protoc"), f"-I{module}", f"--plugin=protoc-gen-go={tools['go']}",
                    f"--go_out={module}", "--go_opt=module=readers", f"c{i}.proto"], module)  # fmt: skip
        assert made.returncode == 0, made.stderr
    assert run(["go", "mod", "tidy"], module).returncode == 0
    built = run(["go", "build", "./..."], module)
    failed = {int(m) for m in re.findall(r"^# readers/p(\d+)$", built.stderr, re.M)}
    assert (built.returncode != 0) == bool(failed), built.stderr
    return [f"go build failed: {built.stderr}" if i in failed else "" for i in range(len(texts))]


def python_hidden(text: str) -> list[str]:
    """The attributes of ``Message`` the schema's Python messages no longer have as such."""
    compiled = compile_proto(text, "t.proto")
    _, value = load_message_classes(
        compiled.descriptor_set, "bulldozer.test.t.KeyMessage", "bulldozer.test.t.ValueMessage"
    )
    plain = compile_proto('syntax = "proto3";\npackage plain;\nmessage E {}\n', "plain.proto")
    (empty,) = load_message_classes(plain.descriptor_set, "plain.E")
    from bulldozer.schema.reader_names import PYTHON_MESSAGE_ATTRIBUTES

    return [n for n in sorted(PYTHON_MESSAGE_ATTRIBUTES) if type(getattr(value(), n)) is not type(getattr(empty(), n))]


def test_each_refused_name_is_refused_and_breaks_the_reader_it_is_refused_for(
    toolchains: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for columns, _, said in REFUSED:
        with pytest.raises(SchemaError) as refused:
            generate_proto(spec_for(["k"]), schema_of(columns))
        assert said in str(refused.value), str(refused.value)
        top_level = "." not in re.findall(r"'([^']*)'", str(refused.value))[0]  # the first column it names
        hint = "in data_movement.renames" if top_level else "rename the nested field in the table"
        assert str(refused.value).endswith(hint), str(refused.value)
    texts = [unchecked_proto(columns, monkeypatch) for columns, _, _ in REFUSED]
    java = java_errors(toolchains, [t for t, (_, lang, _) in zip(texts, REFUSED, strict=True) if lang == "java"])
    # each fails where javac compiles protoc's code: protoc itself took the schema
    built = [c for (c, _, _), e in zip([r for r in REFUSED if r[1] == "java"], java, strict=True) if not e]
    assert not built and all(e.startswith("javac: ") for e in java), (built, java)
    go = go_errors(toolchains, [t for t, (_, lang, _) in zip(texts, REFUSED, strict=True) if lang == "go"])
    assert all(go)
    for text, (columns, lang, _) in zip(texts, REFUSED, strict=True):
        if lang == "python":
            assert python_hidden(text), columns


def test_names_next_to_the_refused_ones_are_taken_and_every_reader_builds(toolchains: dict[str, Any]) -> None:
    proto = generate_proto(spec_for(["k"]), schema_of(NEAR_MISSES))
    text = render_proto(proto)
    assert java_errors(toolchains, [text]) == [""]
    assert go_errors(toolchains, [text]) == [""]
    assert python_hidden(text) == []
    compiled = compile_proto(text, "t.proto")
    _, value = load_message_classes(
        compiled.descriptor_set, "bulldozer.test.t.KeyMessage", "bulldozer.test.t.ValueMessage"
    )
    record = {"x": "1", "get_x": "2", "String": "3", "self": "4", "n": "5", "n_bytes": "6"}
    message = json_format.ParseDict(record, value())
    again = value.FromString(message.SerializeToString())
    assert json_format.MessageToDict(again, preserving_proto_field_name=True) == record


def test_a_job_named_as_a_java_keyword_gets_a_java_package_javac_compiles(toolchains: dict[str, Any]) -> None:
    names = ["default", "new", "int"]
    specs = [spec_for(["k"], name=name) for name in names]
    texts = [render_proto(generate_proto(spec, schema_of([("a", S)]))) for spec in specs]
    packages = [client_java_package(spec) for spec in specs]
    assert packages == [f"dev.bulldozer.clients.{name}_" for name in names]
    assert java_errors(toolchains, texts, packages) == ["", "", ""]
    # named as the job, javac refuses them
    assert all(java_errors(toolchains, texts, [f"dev.bulldozer.clients.{name}" for name in names]))


def test_each_refused_message_name_breaks_java_and_the_others_build(toolchains: dict[str, Any], tmp_path: Path) -> None:
    """A spec's key and value message names: a Java keyword, a class Java nests in every
    message, or a package root the generated code names types by (the reader's io.grpc and
    dev.bulldozer.kv among them) is refused; javac fails on each, and builds the others."""
    from bulldozer.spec.models import JAVA_NESTED_CLASSES, JAVA_PACKAGE_ROOTS

    grpc_api = maven_jar(f"io.grpc:grpc-api:{GRPC_JAVA}", tmp_path)
    refused = ["int", "default", "class", *JAVA_NESTED_CLASSES, *sorted(JAVA_PACKAGE_ROOTS)]
    taken = ["String", "Object", "Target", "List", "Optional", "Metadata", "Override", "System", "DESCRIPTOR", "T"]
    for name in refused:
        with pytest.raises(ValidationError, match=f"'{name}' (is a Java keyword|is the name of the|would hide Java's)"):
            ProtobufConfig.model_validate({"package": "p.t", "value_message": name})
    with pytest.raises(ValidationError, match="is the name of Java's interface for the message T"):
        ProtobufConfig.model_validate({"package": "p.t", "key_message": "T", "value_message": "TOrBuilder"})

    def javac(i: int, name: str) -> str:
        folder = tmp_path / f"m{i}"
        (folder / "src" / "p").mkdir(parents=True)
        (folder / "src" / "dev" / "bulldozer" / "kv" / "v1").mkdir(parents=True)
        (folder / "t.proto").write_text(
            f'syntax = "proto3";\npackage t;\noption java_package = "p";\noption java_multiple_files = true;\n'
            f"message {name} {{ int64 id = 1; }}\nmessage Holder {{ {name} x = 1; }}\n"
        )
        # the names the reader uses beside the messages (bulldozer/codegen/templates/client_java/Reader.java.tmpl)
        (folder / "src" / "p" / "Probe.java").write_text(
            "package p;\nclass Probe {\n  java.lang.String a;\n  com.google.protobuf.ByteString b;\n"
            "  io.grpc.ManagedChannel c;\n  dev.bulldozer.kv.v1.Stub d;\n}\n"
        )
        (folder / "src" / "dev" / "bulldozer" / "kv" / "v1" / "Stub.java").write_text(
            "package dev.bulldozer.kv.v1;\npublic class Stub {}\n"
        )
        return protoc_javac(toolchains, folder, [toolchains["jar"], grpc_api])

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(javac, range(len(refused) + len(taken)), refused + taken))
    assert [n for n, r in zip(refused, results, strict=False) if not r.startswith("javac:")] == []
    assert [(n, r) for n, r in zip(taken, results[len(refused) :], strict=True) if r] == []


def test_a_java_client_builds_whatever_java_lang_or_import_names_its_job_and_messages_take(tmp_path: Path) -> None:
    """The reader names every type in full: a job named ``string`` (its outer class String)
    with messages named Target and Optional once broke it (each simple name meant the
    job's class); now the Maven project builds."""
    from bulldozer.codegen.native import generate_java_client
    from bulldozer.schema.job import build_job_schema
    from bulldozer.spec.models import JobSpec

    spec = JobSpec.model_validate(
        {
            "apiVersion": "bulldozer/v1",
            "kind": "MoveDataToKvDal",
            "metadata": {"name": "string", "owner": "tests"},
            "data_movement": {"source": {"table": "db.t"}, "key_columns": ["k"]},
            "key_value_dal": {"alias": "string"},
            "bulldozer_protobuf": {"package": "p.strings", "key_message": "Target", "value_message": "Optional"},
        }
    )
    job = build_job_schema(spec, schema_of([("a", S), ("b", L)]))
    generate_java_client(spec, job, tmp_path / "java")
    built = run(["mvn", "-q", "-B", "package"], tmp_path / "java", jvm.maven_env())
    assert built.returncode == 0, built.stdout[-3000:]
    assert list((tmp_path / "java" / "target").glob("*-all.jar"))

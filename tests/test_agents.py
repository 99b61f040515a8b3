"""Agent frameworks against the front door, unchanged, both layouts: LangChain's ``ChatOpenAI`` with a tool bound and
forced (the call validates; streamed chunks join to the same call; the answer after the tool's result), LangChain's
agent loop (call, tool, answer), and the OpenAI Agents SDK (``Agent`` + ``function_tool`` + ``Runner.run``) over the
Responses API and over chat completions. The tiny model's text is noise: what is checked is that every framework gets
well-formed calls of its tool with arguments that validate, and runs the tool."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

pytestmark = pytest.mark.both_layouts

MODEL = "tiny"
CITIES: list[str] = []  # what the tool was called with, in order
# The tool's argument is an enum: the guide makes every call valid JSON of the schema, but a random model left free in
# a string never closes it, and a call cut off by max_tokens is no call.
City = Literal["Paris", "Rome", "Oslo"]


@pytest.fixture(scope="module")
def triton(long_triton):
    return long_triton


@pytest.fixture(autouse=True)
def _fresh_calls():
    CITIES.clear()


def forecast(city: City) -> str:
    CITIES.append(city)
    return f"sunny in {city}"


def langchain_llm(front, **kwargs):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=MODEL, base_url=front.v1, api_key="x", max_retries=0, timeout=120, **kwargs)


def langchain_tool():
    from langchain_core.tools import tool

    @tool
    def get_weather(city: City) -> str:
        """The weather in a city."""
        return forecast(city)

    return get_weather


def test_langchain_forced_tool_call_then_the_answer_with_its_result(front):
    from langchain_core.messages import HumanMessage

    tool = langchain_tool()
    llm = langchain_llm(front, max_tokens=24)
    # Room for the whole call: the tiny model's tokenizer spends a token on about every character of it.
    forced = langchain_llm(front, max_tokens=120).bind_tools([tool], tool_choice="get_weather")
    ask = [HumanMessage("What is the weather in Paris?")]
    called = forced.invoke(ask)
    assert len(called.tool_calls) >= 1 and called.tool_calls[0]["name"] == "get_weather"
    assert called.tool_calls[0]["args"]["city"] in City.__args__  # parsed: valid JSON of the tool's schema
    result = tool.invoke(called.tool_calls[0])  # a ToolMessage answering the call by id
    answer = llm.bind_tools([tool]).invoke([*ask, called, result])
    assert answer.content and not answer.tool_calls and CITIES == [called.tool_calls[0]["args"]["city"]]

    joined = None  # streamed: the chunks add up to the same call
    for chunk in forced.stream(ask):
        joined = chunk if joined is None else joined + chunk
    assert [c["args"] for c in joined.tool_calls] == [c["args"] for c in forced.invoke(ask).tool_calls]


def test_langchain_agent_loop_calls_the_tool_and_answers(front):
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_model_call
    from langchain_core.messages import ToolMessage

    @wrap_model_call
    def call_first(request, handler):
        """Forced to call the tool until it has run once, then free to answer (forced on every turn, an agent loops
        for ever)."""
        ran = any(isinstance(m, ToolMessage) for m in request.messages)
        return handler(request.override(tool_choice=None if ran else "required"))

    agent = create_agent(langchain_llm(front, max_tokens=120), tools=[langchain_tool()], middleware=[call_first])
    out = agent.invoke({"messages": [{"role": "user", "content": "Weather in Rome?"}]}, {"recursion_limit": 6})
    kinds = [type(m).__name__ for m in out["messages"]]
    assert kinds[:3] == ["HumanMessage", "AIMessage", "ToolMessage"] and CITIES, out["messages"][1]
    assert kinds[-1] == "AIMessage" and out["messages"][-1].content


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_openai_agents_sdk_runs_a_tool_and_answers(front, api):
    from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool,
                        set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: City) -> str:
        """The weather in a city."""
        return forecast(city)

    async def run():
        client = AsyncOpenAI(base_url=front.v1, api_key="x", max_retries=0)
        model = (OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel)(
            model=MODEL, openai_client=client)
        # The tool's result is the agent's output (stop_on_first_tool): a random model's free text never ends, and over
        # the Responses API a reply cut at max_output_tokens is `incomplete`, which the SDK raises. The answer after a
        # tool's result is LangChain's loop above.
        agent = Agent(name="weather", instructions="Use the tool.", tools=[get_weather], model=model,
                      tool_use_behavior="stop_on_first_tool",
                      model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, max_tokens=120))
        try:
            return await Runner.run(agent, "What is the weather in Oslo?", max_turns=4)
        finally:
            await client.close()

    result = asyncio.run(run())
    assert len(CITIES) == 1 and CITIES[0] in City.__args__
    assert result.final_output == f"sunny in {CITIES[0]}"

"""A Pydantic model as a tool: its fields are the arguments; the call comes back as an
instance of the model (validated by the grammar and again by Pydantic)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from chatkit import Conversation, Model


class CreateTicket(BaseModel):
    """Open a support ticket."""

    title: str = Field(max_length=60)
    priority: int = Field(ge=1, le=5)
    component: str = Field(max_length=20)


def main() -> None:
    conv = Conversation(Model.load())
    reply = conv.send("The login page crashes on submit. It's urgent!", tools=[CreateTicket],
                      tool_choice="required", parallel_tool_calls=False, max_tokens=80)
    ticket = reply.tool_calls[0].parsed_as(CreateTicket)
    print(ticket.model_dump_json())


if __name__ == "__main__":
    main()

"""Training text for the demo tokenizer: plain everyday English plus a few accented words, CJK and
emoji, so that some merged tokens hold multi-byte characters and others split them (useful for
UTF-8 tests). Changing this text changes the demo vocabulary: bump `DEMO_VERSION` in demo.py."""

from __future__ import annotations

CORPUS = """\
The kettle clicked off just as the rain started, so we made tea and watched the street go grey.
My neighbour waters her tomatoes every evening at seven, even when the forecast promises a storm.
On Saturday mornings the market smells of warm bread, fresh basil and strong coffee.
He forgot his umbrella on the bus again; the driver now keeps a box of lost things behind her seat.
The library opens at nine, but the queue for the quiet room starts forming at half past eight.
She learned to ride a bicycle at thirty and now cycles to work along the river path every day.
Our cat sleeps in the laundry basket whenever the towels are still warm from the dryer.
If you boil pasta in a small pot, the water foams over and the stove needs cleaning afterwards.
The train was twelve minutes late, which gave me time to finish the crossword in the paper.
Grandpa fixes old radios in the garage and hums along to whatever station comes through first.
We planted three apple trees last spring; one of them already has tiny green fruit on it.
The bakery on the corner sells out of cinnamon rolls before ten, so arrive early if you want one.
A good pair of walking shoes matters more than an expensive jacket on a long hike.
The children built a fort from couch cushions and refused to leave it even for dinner.
When the power went out, we lit candles, played cards and told stories until midnight.
Please remember to bring a reusable bag, because the shop charges for plastic ones now.
The dentist said I should floss more often and drink less sugary juice in the afternoon.
Our team meeting moved to Thursday, so the report is due a day later than we planned.
He keeps a notebook by the bed to write down ideas that arrive just before he falls asleep.
The soup needs more salt, a squeeze of lemon and perhaps a handful of chopped parsley.
Snow covered the whole village overnight, and the school bus could not climb the hill.
My sister paints small watercolours of birds and gives them to friends on their birthdays.
The museum is free on the first Sunday of each month, which is why it gets so crowded.
I set two alarms because the first one never wakes me and the second one always does.
The old bridge across the canal is closed for repairs until the end of the summer.
Washing the car on a windy day is pointless; the dust comes back before the soap dries.
She ordered a large coffee with oat milk, a blueberry muffin and a glass of cold water.
The garden hose has a leak near the tap, so the path stays muddy all week.
Reading on the train is easier with headphones that block out the noise of the carriage.
The recipe asks for two eggs, a cup of flour, half a cup of milk and a pinch of salt.
Our flight was delayed by an hour because of fog, but the crew handed out free snacks.
He counts his steps every day and tries to walk at least eight thousand of them.
The new phone takes sharp photos at night, although the battery drains rather quickly.
Every autumn the park fills with people collecting chestnuts and kicking piles of leaves.
The landlord promised to fix the heating before winter, and he finally kept his word.
She writes shopping lists on the back of old envelopes and then leaves them at home.
A short nap after lunch helps some people, while others wake up feeling even more tired.
The dog barks at the postman each morning, then wags his tail when the letters arrive.
We took the ferry to the island, rented bikes and ate fish and chips by the harbour.
The printer jammed twice, ran out of ink, and then printed the wrong page upside down.
On hot days the swimming pool is packed, so we go in the evening when it is calmer.
My uncle tells the same joke at every family dinner, and we all laugh anyway.
The clock in the kitchen runs five minutes fast, which is how we are never late.
Fresh strawberries taste best in June, straight from the field and still warm from the sun.
The bus stop has a new shelter with a bench, a map and a screen showing arrival times.
He practises the piano for twenty minutes before breakfast, mostly scales and simple songs.
The weather report says it will be sunny tomorrow, with a light breeze from the west.
Two friends opened a small bookshop that also serves tea, cake and homemade lemonade.
The hallway light flickers whenever someone runs the washing machine downstairs.
Learning a new language takes patience, daily practice and a willingness to make mistakes.
The farmer sells eggs from a table by the road, trusting people to leave the money in a tin.
Our street holds a party every July, with music, long tables and far too much food.
She keeps her keys in the same bowl by the door so she never has to search for them.
The mountain cabin had no signal, so we read books, cooked stew and slept early.
I always forget which drawer holds the scissors, even though it has been the same for years.
The hospital car park is full by noon, so visitors are asked to take the shuttle bus.
A warm bath, a good book and a quiet house make a perfect end to a long week.
The football match was cancelled after heavy rain turned the pitch into a muddy lake.
He replaced the bicycle chain himself, following a video and getting grease on everything.
The café downstairs serves crème brûlée, croissants and a very strong espresso.
Her naïve plan was to paint the whole house in one weekend; it took most of the month.
In Tokyo we ordered ramen at a tiny counter, and the menu said 東京 ラーメン in big letters.
My friend from Beijing taught me to write 你好 and 谢谢, and I practise them on napkins.
The message just said 🙂 and a photo of a cake 🎂, which was enough to make my day ☀️.
Numbers matter too: 3 apples, 12 eggs, 7 days, 24 hours, 100 metres and 2025 plans.
Questions help: Where is the station? What time does it close? Can I pay by card?
"Good morning," said the baker, "the rye loaf is still warm, would you like one?"
Lists look like this: milk, bread, butter, cheese, onions, carrots and a bag of rice.
The meeting notes read: 1) budget, 2) schedule, 3) next steps - and nothing else.
"""
